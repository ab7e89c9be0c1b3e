"""Generation: prompts in, responses out, from the policy as it is now.

    samplers.py   the sampler interface and its implementations (build_sampler picks one)
    responses.py  generation on the hydra's own model, in chunks: transformers' generate or the
                  decode loop, the shared prefill, the split states recorded while sampling
    decode.py     hydrappo's own decode loop
    stops.py      where a response ends (stop token ids, stop strings)
    serving.py    a serving engine (vLLM) behind the sampler interface

The experience pass that follows (packing, the hydra's pass, the PPO batch) is train/'s.
"""
