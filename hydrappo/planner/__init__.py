"""The GPU memory planner: what a PPO run needs, component by component, for hydrappo's one
trunk and for the classic four-model layout, and which GPUs it fits (`hydrappo memory`).

    settings.py     training settings and the plan's constants
    counts.py       exact parameter counts on the meta device
    activations.py  bytes autograd keeps, traced from one decoder layer
    plan.py         the per-component plan, its formatting, the largest model per GPU size
    presets.py      configurations of public models by name
    tokenizer.py    a word-level tokenizer built in code, for random models of any vocabulary
The validation run that checks the plan against measured training lives in
planner/validate.py.
"""

from .counts import count_parameters, load_model_config, unique_bytes
from .plan import MemoryPlan, format_plan, largest_models, plan_memory, plan_to_dict, preset_plans
from .settings import GIB, TrainingSettings

__all__ = [
    "GIB",
    "MemoryPlan",
    "TrainingSettings",
    "count_parameters",
    "format_plan",
    "largest_models",
    "load_model_config",
    "plan_memory",
    "plan_to_dict",
    "preset_plans",
    "unique_bytes",
]
