"""One home for answering and scoring held-out prompts, below the loops (it imports nothing from train/):

heldout.py   the schedule and statistics of held-out evaluation during a run (HeldOutEvaluation), and
             answer_and_score, the one "answer and score" path that generate and compare share with it
compare.py   `hydrappo generate` and `hydrappo compare`: loading checkpoints and models for them, the
             prompts (a file, or a task's held-out items), the reward that scores
options.py   their command-line options, declared once
tables.py    their side-by-side tables: terminal, markdown, HTML, jsonl
"""
