"""Studies of an example's settings: each run is `python -m hydrappo train CONFIG OPTIONS...` in a
process of its own, exactly what a user runs, then measured on held-out prompts.

    sweeps.py    a config's variants in child processes; the KL frontier, the top-N / LoRA / full
                 study and one report over several study folders (the examples' frontier.py,
                 study.py and levers.py call them)
    measure.py   one checkpoint on held-out prompts: score, KL to the reference, EOS, looping tails,
                 distinct-2; and at several sampling seeds (`python -m hydrappo.study measure`)

A study's numbers are those of the command lines it prints; its peak resident memory comes from
the child's rusage (the CPU's memory, not a GPU's). matplotlib (the `examples` extra) draws the
figures.
"""
