"""A study's runs and tables: a variant of a config trained in a child process (resumed when cut off,
reused when finished), its metrics.jsonl summarised; the reward-against-KL frontier of one KL knob,
the top-N against LoRA against full fine-tuning study, and one report over several study folders.

    python -m hydrappo.study report OUT.md OUT.png DIR [DIR ...]   # report_main
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ..config import Config
from ..config.command_line import argument, command_parser, options_from
from ..planner import plan as planner
from ..planner.presets import preset_config
from ..planner.settings import TrainingSettings
from ..storage.checkpoint import CheckpointError, find_checkpoint, load_checkpoint_config
from .measure import heldout


@dataclass
class Variant:
    """One run: a name, the config file and the options on top of it."""

    name: str
    config: Path
    options: list[str] = field(default_factory=list)


def command(variant: Variant, output_dir: Path, steps: int | None) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "hydrappo",
        "train",
        str(variant.config),
        *variant.options,
        "--output_dir",
        str(output_dir),
        "--no_progress_bar",
    ]
    if steps:
        cmd += ["--total_steps", str(steps)]
        if "--save_every" not in variant.options:  # else the variant keeps checkpoints along the way
            cmd += ["--save_every", str(steps)]
    return cmd


def run_variant(variant: Variant, output_dir: Path, steps: int | None, threads: int | None = None) -> dict:
    """Train one variant in a child process (resuming a finished or cut-off run in that folder).
    Returns {"command", "seconds", "peak_rss_mib"}; raises when the run fails."""
    cmd = command(variant, output_dir, steps)
    done = read_metrics(output_dir)
    if done and steps and done[-1]["step"] >= steps:
        print(f"{variant.name}: {output_dir} already has {steps} steps", flush=True)
        return {"command": " ".join(cmd), "seconds": None, "peak_rss_mib": None}
    if done:
        cmd.append("--resume")
    seconds, peak = run_logged(cmd, output_dir.parent / f"{output_dir.name}.log", threads, variant.name)
    return {"command": " ".join(cmd), "seconds": seconds, "peak_rss_mib": peak}


def run_logged(cmd: list[str], log: Path, threads: int | None = None, name: str = "the run") -> tuple[float, float]:
    """Run `cmd` in a child process, its output appended to `log`. Returns (seconds, the child's peak
    RSS in MiB, from its rusage); raises when it fails."""
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    print("$", " ".join(cmd), flush=True)
    start = time.perf_counter()
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as handle:
        child = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{name}: the run failed (exit {os.waitstatus_to_exitcode(status)}); see {log}")
    return time.perf_counter() - start, usage.ru_maxrss / 1024


def read_metrics(output_dir: Path) -> list[dict]:
    path = output_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def summarise_metrics(rows: list[dict], last: int = 10) -> dict:
    """Means over the last `last` steps of what the studies report, and the median step time."""
    tail = rows[-last:]

    def mean(key):
        values = [row[key] for row in tail if key in row]
        return statistics.fmean(values) if values else None

    times = [row.get("time/rollout", 0.0) + row.get("time/update", 0.0) for row in rows]
    return {
        "steps": rows[-1]["step"] if rows else 0,
        "train_reward_last": mean("env/reward_mean"),
        "kl_last": mean("objective/kl"),
        "kl_coef_last": mean("objective/kl_coef"),
        "entropy_last": mean("objective/entropy"),
        "degenerate_last": mean("env/degenerate_frac"),
        "missing_eos_last": mean("env/missing_eos_frac"),
        "median_step_s": statistics.median(times) if times else None,
        "total_step_min": sum(times) / 60,
    }


def markdown_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """rows of dicts -> a markdown table; columns: (header, key, format)."""
    lines = ["| " + " | ".join(h for h, _, _ in columns) + " |", "|" + " --- |" * len(columns)]
    for row in rows:
        cells = []
        for _, key, fmt in columns:
            value = row.get(key)
            cells.append("" if value is None else format(value, fmt) if fmt else str(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(
    points: list[dict],
    x: str,
    y: str,
    path: Path,
    title: str,
    xlabel: str,
    ylabel: str,
    label: str = "name",
    base: dict | None = None,
    joined: bool = True,
) -> None:
    """A scatter of `points` (dicts) with their labels, joined in order (a frontier) or not (settings
    that form no curve), optionally the base model as a star, to a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5), dpi=120)
    xs, ys = [p[x] for p in points], [p[y] for p in points]
    if joined:
        ax.plot(xs, ys, "o-" if len(points) > 1 else "o", color="tab:blue")
        low, high = min(xs), max(xs)
        for p in points:
            # Labels of points on the right run leftwards, to stay inside the axes.
            right = high > low and (p[x] - low) / (high - low) > 0.6
            offset, align = ((-4, 4), "right") if right else ((4, 4), "left")
            ax.annotate(str(p[label]), (p[x], p[y]), textcoords="offset points", xytext=offset, ha=align, fontsize=8)
    else:
        # Settings form no curve and often sit close together: each point has its own marker and
        # colour and its name in the legend, where labels beside the points would overprint.
        markers = "osD^v<>pPX*h"
        for i, p in enumerate(points):
            ax.plot([p[x]], [p[y]], markers[i % len(markers)], color=f"C{i % 10}", label=str(p[label]))
    if base is not None:
        ax.plot([base[x]], [base[y]], "*", color="tab:red", markersize=12, label="base model")
    if base is not None or not joined:
        ax.legend(loc="best", fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def rusage_note() -> str:
    return f"peak RSS of this process so far: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB"


# ---------------------------------------------------------------------------- the frontier
@dataclass
class RunOptions:
    """The options every study script shares: the runs' length, config and held-out measurement. A None
    default is the example's own (the script's DEFAULTS, given to parse_study)."""

    steps: int | None = argument(None, "PPO steps per run (default: the config's)")
    config: str | None = argument(None, "the runs' config (default: the example's)")
    eval_prompts: str | None = argument(None, "the held-out prompts (default: the example's)")
    reward_fn: str | None = argument(None, "the held-out reward (default: the example's)")
    limit: int | None = argument(None, "held-out prompts to use (default: all)")
    output_dir: str | None = argument(None, "the study's folder (default: the example's)")
    extra: list[str] | None = argument(None, "more options for every run", nargs=argparse.REMAINDER)


@dataclass
class FrontierOptions(RunOptions):
    values: list[float] | None = argument(None, "values of --knob (default: the example's)")
    knob: Literal["kl_target", "init_kl_coef"] = argument("kl_target", "the KL knob the runs differ in")


def parse_study(options: type, defaults: dict, doc: str, argv=None):
    """A study script's options: `defaults` (its DEFAULTS: config, eval_prompts, reward_fn, output_dir, ...)
    fill what the command line leaves out."""
    parser = command_parser(options, None, doc.split("\n\n")[0])
    names = {f.name for f in dataclasses.fields(options)}
    parser.set_defaults(
        extra=[],
        variants=list(STUDY_VARIANTS),
        **{name: str(value) if isinstance(value, Path) else value for name, value in defaults.items() if name in names},
    )
    return options_from(options, parser.parse_args(argv))


def frontier_main(defaults: dict, doc: str, argv=None) -> int:
    """Held-out reward against KL for several values of one KL knob (a target of the config's
    controller, or a fixed coefficient): one run per value, one PNG, a markdown table and the
    JSON of every point. `defaults`: config, eval_prompts, reward_fn (the held-out reward, e.g. a
    gold reward), knob ("kl_target" or "init_kl_coef"), values, extra options, output_dir."""
    args = parse_study(FrontierOptions, defaults, doc, argv)
    out = Path(args.output_dir)
    # The base model is the config's with the options given for every run (--extra), so a path they
    # override (a reward branch's) is checked where the runs will find it.
    base = heldout(
        None,
        Path(args.eval_prompts),
        args.reward_fn,
        base_config=Path(args.config),
        limit=args.limit,
        base_options=args.extra,
    )
    base.update(name="base", value=0.0)
    points = []
    for value in args.values:
        name = f"{args.knob}={value:g}"
        options = [*defaults.get("options", []), f"--{args.knob}", str(value), *args.extra]
        run_dir = out / name.replace("=", "_")
        run = run_variant(Variant(name, Path(args.config), options), run_dir, args.steps)
        point = {"name": f"{value:g}", "value": value, **run, **summarise_metrics(read_metrics(run_dir))}
        point.update(heldout(run_dir, Path(args.eval_prompts), args.reward_fn, limit=args.limit))
        points.append(point)
        print(json.dumps({k: v for k, v in point.items() if k != "samples"}), flush=True)
        (out / "frontier.json").write_text(json.dumps({"base": base, "points": points}, indent=1))
    points.sort(key=lambda p: p["kl"])
    title = f"{Path(args.config).parent.name}: held-out reward vs KL ({args.knob}, {points[0].get('steps')} steps)"
    plot(
        points,
        "kl",
        "reward",
        out / "frontier.png",
        title,
        "KL to the reference (nats per response, held-out)",
        "held-out reward",
        base=base,
    )
    columns = [
        (args.knob, "name", ""),
        ("held-out reward", "reward", ".3f"),
        ("held-out KL", "kl", ".2f"),
        ("train KL, last 10", "kl_last", ".2f"),
        ("beta, last 10", "kl_coef_last", ".3f"),
        ("ends with EOS", "eos_frac", ".2f"),
        ("degenerate", "degenerate_frac", ".2f"),
        ("distinct-2", "distinct2", ".2f"),
        ("same first 4 words", "same_opening_share", ".2f"),
        ("median step s", "median_step_s", ".1f"),
    ]
    table = markdown_table([base, *points], columns)
    (out / "frontier.md").write_text(table + "\n")
    print(table)
    print(f"wrote {out / 'frontier.png'}")
    return 0


# ---------------------------------------------------------------------------- top-N vs LoRA vs full
STUDY_VARIANTS = {
    "N=1": ["--num_layers_unfrozen", "1"],
    "N=2": ["--num_layers_unfrozen", "2"],
    "N=4": ["--num_layers_unfrozen", "4"],
    "N=8": ["--num_layers_unfrozen", "8"],
    # The command line's --num_layers_unfrozen replaces a config's band, which LoRA in every layer cannot serve.
    "LoRA r=16, all layers": ["--num_layers_unfrozen", "4", "--lora_r", "16", "--lora_layers", "all"],
    "full (N=-1)": ["--num_layers_unfrozen", "-1"],
    # Every layer trains at the example's learning rate above; full fine-tuning usually wants a smaller one.
    "full lr=1e-5 (N=-1)": ["--num_layers_unfrozen", "-1", "--learning_rate", "1e-5"],
    # Bands of trainable layers in the middle of SmolLM2-135M's 30 (the top 4 are 26:30).
    "band=6:10": ["--trainable_layers", "6:10"],
    "band=13:17": ["--trainable_layers", "13:17"],
    "band=20:24": ["--trainable_layers", "20:24"],
    "band=14:16": ["--trainable_layers", "14:16"],
    "LoRA r=16 band=13:17": ["--trainable_layers", "13:17", "--lora_r", "16"],
}


# A learning-rate sweep per kind of setting (--sweep): three rates about 3x apart around what each
# kind is known to want. Fewer trainable weights take larger steps: LoRA about 10x full fine-tuning
# (Schulman et al. 2025, "LoRA Without Regret"); a few top or middle layers sit between.
LEARNING_RATE_GRIDS = {
    "layers": [1e-4, 3e-4, 1e-3],
    "lora": [3e-5, 1e-4, 3e-4],
    "full": [3e-6, 1e-5, 3e-5],
}


def learning_rate_grid(options: list[str]) -> list[float]:
    """The sweep's learning rates for a setting, by its kind (LoRA, full fine-tuning, some layers)."""
    if "--lora_r" in options:
        return LEARNING_RATE_GRIDS["lora"]
    if any(flag == "--num_layers_unfrozen" and value == "-1" for flag, value in zip(options, options[1:])):
        return LEARNING_RATE_GRIDS["full"]
    return LEARNING_RATE_GRIDS["layers"]


def planner_figure(options: list[str], preset: str = "llama-3.1-8b", gpu_gib: int = 24) -> dict:
    """The planner's peak for the same trainable setting on a 7-8B preset (bf16, the planner's
    default batch), and whether it fits a `gpu_gib` GPU."""
    layers, band, rank, everywhere = 4, None, 0, False
    for flag, value in zip(options, options[1:]):
        if flag == "--num_layers_unfrozen":
            layers, band = int(value), None
        elif flag == "--trainable_layers":  # the same band of the preset's layers (it has more than the example's)
            band = value
        elif flag == "--lora_r":
            rank = int(value)
        elif flag == "--lora_layers":
            everywhere = value == "all"
    config = preset_config(preset)
    if everywhere:
        layers = config.num_hidden_layers  # adapters in every layer: the planner's LoRA on the top N
    # The examples score with reward functions: no reward model in the plan.
    settings = TrainingSettings(
        num_layers_unfrozen=layers, trainable_layers=None if everywhere else band, lora_rank=rank, reward_model=False
    )
    plan = planner.plan_memory(config, settings, preset)
    return {"planner_peak_gib": plan.hydra.peak / 2**30, "planner_fits": plan.hydra.fits(gpu_gib)}


@dataclass
class StudyOptions(RunOptions):
    variants: list[str] | None = argument(None, "the settings to run (default: all)", choices=list(STUDY_VARIANTS))
    preset: str = argument("llama-3.1-8b", "the planner's model for the memory column")
    sweep: bool = argument(False, "run every setting at the three learning rates of its kind (LEARNING_RATE_GRIDS)")


def study_main(defaults: dict, doc: str, argv=None) -> int:
    """Top-N against LoRA against full fine-tuning on one example: a run per setting, the
    held-out result, step time, peak memory of the run (CPU RSS) and the planner's figure for a
    7-8B model on a 24 GB GPU; a table and a PNG (held-out reward against median step time)."""
    args = parse_study(StudyOptions, defaults, doc, argv)
    out = Path(args.output_dir)
    runs = []
    for name in args.variants:
        options = [*defaults.get("options", []), *STUDY_VARIANTS[name]]
        folder = (
            name.split(",")[0].replace("=", "").replace(" ", "_").replace("(", "").replace(")", "").replace(":", "-")
        )
        if not args.sweep:
            runs.append((name, options, folder))
            continue
        for rate in learning_rate_grid(options):
            runs.append((f"{name} lr={rate:g}", [*options, "--learning_rate", f"{rate:g}"], f"{folder}_lr{rate:g}"))
    # Rows of earlier invocations into the same folder stay in the table (a study run in parts).
    earlier = out / "study.json"
    rows = json.loads(earlier.read_text()) if earlier.exists() else []
    for name, options, folder in runs:
        options = [*options, *args.extra]
        run_dir = out / folder
        run = run_variant(Variant(name, Path(args.config), options), run_dir, args.steps)
        if run["seconds"] is None:  # trained before, only measured now: keep what its training recorded
            earlier_row = next((r for r in rows if r["name"] == name), {})
            run.update(seconds=earlier_row.get("seconds"), peak_rss_mib=earlier_row.get("peak_rss_mib"))
        row = {"name": name, **run, **summarise_metrics(read_metrics(run_dir)), **planner_figure(options, args.preset)}
        row.update(heldout(run_dir, Path(args.eval_prompts), args.reward_fn, limit=args.limit))
        rows = [r for r in rows if r["name"] != name] + [row]
        print(json.dumps({k: v for k, v in row.items() if k != "samples"}), flush=True)
        (out / "study.json").write_text(json.dumps(rows, indent=1))
    columns = [
        ("setting", "name", ""),
        ("steps", "steps", "d"),
        ("held-out reward", "reward", ".3f"),
        ("held-out KL", "kl", ".2f"),
        ("median step s", "median_step_s", ".1f"),
        ("peak RSS MiB", "peak_rss_mib", ".0f"),
        (f"planner peak GiB ({args.preset})", "planner_peak_gib", ".1f"),
        ("fits 24 GB", "planner_fits", ""),
    ]
    table = markdown_table(rows, columns)
    (out / "study.md").write_text(table + "\n")
    plot(
        rows,
        "median_step_s",
        "reward",
        out / "study.png",
        f"{Path(args.config).parent.name}: top-N vs LoRA vs full",
        "median step time (s, this machine)",
        "held-out reward",
        joined=False,
    )
    print(table)
    return 0


# ---------------------------------------------------------------------------- one table from several studies
def option_value(command: str, flag: str, default: str | None = None) -> str | None:
    """The last value given to `flag` in a printed command line (the one argparse keeps)."""
    words = command.split()
    values = [words[i + 1] for i, word in enumerate(words[:-1]) if word == flag]
    return values[-1] if values else default


def held_out_curve(run_dir: Path, key: str) -> dict[int, float]:
    """{step: value} of one eval/* scalar of a run (the held-out curve the run logged)."""
    return {int(row["step"]): row[key] for row in read_metrics(run_dir) if key in row}


def checkpoint_config(run_dir: Path) -> Config:
    """The config a run's newest checkpoint keeps (its config file and command line together)."""
    try:
        return load_checkpoint_config(find_checkpoint(run_dir), Config)
    except CheckpointError as error:  # a study folder whose run never saved: say which
        raise SystemExit(f"the report reads each run's settings from its checkpoint: {error}") from None


def learning_rate_text(rate: float, scheduler: str) -> str:
    """A run's learning rate as the report prints it, with its schedule unless constant ("1e-04 cosine")."""
    return f"{rate:.0e}" if scheduler == "constant" else f"{rate:.0e} {scheduler}"


def best_run_per_setting(rows: list[dict]) -> dict[str, dict]:
    """Each setting's run at its best learning rate: the highest point of its held-out curve, a tie
    going to the higher sampled score of the last checkpoint (two rates can both reach 0.80 greedy
    and differ by 0.08 sampled). Runs without a curve are left out."""
    best = {}
    for r in rows:
        if r["best"] is None:
            continue
        held = best.get(r["setting"])
        if held is None or (r["best"], r["reward"]) > (held["best"], held["reward"]):
            best[r["setting"]] = r
    return best


def curve_summary(curve: dict[int, float]) -> dict:
    """A held-out curve's best point, the step it came at and its last point (None without a curve)."""
    if not curve:
        return {"best": None, "best_step": None, "last": None}
    return {"best": max(curve.values()), "best_step": max(curve, key=curve.get), "last": curve[max(curve)]}


def report_table(rows: list[dict]) -> str:
    """The report's markdown table: a row per run, its held-out curve a column per step."""
    steps = sorted({step for r in rows for step in r["curve"]})
    lines = [
        "| setting | lr | curve | "
        + " | ".join(f"step {s}" for s in steps)
        + " | best (step) | sampled score | sampled KL | ends with EOS | looping | peak RSS MiB | planner GiB |",
        "| --- | ---: | --- |" + " ---: |" * len(steps) + " ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        cells = [f"{r['curve'][s]:.2f}" if s in r["curve"] else "" for s in steps]
        rss = f"{r['peak_rss_mib']:.0f}" if r.get("peak_rss_mib") else ""
        best = f"{r['best']:.2f} ({r['best_step']})" if r["curve"] else ""  # a run without data.eval_prompts
        lines.append(
            f"| {r['setting']} | {r['rate']} | {r['decoding']} | "
            + " | ".join(cells)
            + f" | {best} | {r['reward']:.2f} | {r['kl']:.1f} | {r['eos_frac']:.2f}"
            + f" | {r['degenerate_frac']:.2f} | {rss} | {r['planner_peak_gib']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def read_report_table(text: str) -> list[dict]:
    """The rows of a table report_table() wrote, back as the dicts it was written from (to the
    table's two decimals): a sweep continued later, when its earlier run folders are gone, keeps its
    earlier rows in the new table and PNG."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    if len(lines) < 2 or not lines[0].startswith("| setting | lr | curve |"):
        raise ValueError(
            "not a table written by `python -m hydrappo.study report` (its header starts '| setting | lr | curve |')"
        )
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    steps = [int(name.split()[1]) for name in header if name.startswith("step ")]
    rows = []
    for line in lines[2:]:
        cells = dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")), strict=True))
        curve = {s: float(cells[f"step {s}"]) for s in steps if cells[f"step {s}"]}
        rows.append(
            {
                "setting": cells["setting"],
                "rate": cells["lr"],
                "lr": float(cells["lr"].split()[0]),
                "decoding": cells["curve"],
                "curve": curve,
                **curve_summary(curve),
                "reward": float(cells["sampled score"]),
                "kl": float(cells["sampled KL"]),
                "eos_frac": float(cells["ends with EOS"]),
                "degenerate_frac": float(cells["looping"]),
                "peak_rss_mib": float(cells["peak RSS MiB"]) if cells["peak RSS MiB"] else None,
                "planner_peak_gib": float(cells["planner GiB"]),
            }
        )
    return rows


def study_folder_problem(folder: Path) -> str | None:
    """Why `folder` is not a study folder (one a study wrote, holding its study.json), or None."""
    if not folder.exists():
        return f"report: {folder} does not exist; give the study folders (each holds a study.json)"
    if not folder.is_dir():
        hint = " (a table this command wrote goes after --earlier)" if folder.suffix == ".md" else ""
        return f"report: {folder} is a file, not a study folder; give the folders that hold a study.json{hint}"
    if not (folder / "study.json").is_file():
        return f"report: {folder} holds no study.json, so no study ran there; give the folders a study wrote"
    return None


def study_folder_rows(folder: Path, curve_key: str) -> list[dict]:
    """The report's rows for the runs of one study folder (its study.json): each run's settings
    read from its checkpoint, its held-out curve from its metrics, the planner's figure for its
    layers."""
    rows = []
    for row in json.loads((folder / "study.json").read_text()):
        run_dir = Path(option_value(row["command"], "--output_dir"))
        curve = held_out_curve(run_dir, curve_key)
        settings = checkpoint_config(run_dir)
        row.update(planner_figure(row["command"].split()))  # the current plan (no reward model), for every row alike
        rows.append(
            {
                **row,
                "setting": row["name"].split(" lr=")[0],
                "lr": settings.ppo.learning_rate,
                "rate": learning_rate_text(settings.ppo.learning_rate, settings.ppo.lr_scheduler),
                "curve": curve,
                "decoding": "greedy" if settings.train.eval_greedy else "sampled",
                **curve_summary(curve),
            }
        )
    return rows


@dataclass
class ReportOptions:
    table: Path | None = argument(None, "the markdown table to write", positional=True)
    png: Path | None = argument(None, "the PNG to write", positional=True)
    dirs: list[Path] | None = argument(None, "the study folders", positional=True, nargs="*")
    curve: str = argument("eval/reward/accuracy", "the eval/* scalar of the held-out curve")
    earlier: list[Path] | None = argument(None, "tables this command wrote before")
    title: str = argument("held-out score against memory, each setting at its best learning rate", "the PNG's title")


def report_main(argv=None) -> int:
    """One table and one PNG from the study.json files of several study folders (a study run in
    parts, e.g. a learning-rate sweep in folders of its own):

        python -m hydrappo.study report OUT.md OUT.png DIR [DIR ...] [--curve eval/reward/accuracy]
            [--earlier TABLE.md]

    Each row: the setting, its learning rate and schedule, the held-out curve the run logged
    (`--curve`; greedy or sampled, as its train.eval_greedy says), the sampled held-out score and KL
    of the last checkpoint (heldout()), how the answers end, peak RSS of the run and the planner's
    figure for the preset. The rate, schedule and decoding are read from the run's checkpoint. The
    PNG has one point per setting at its best learning rate (best_run_per_setting): held-out score
    against the planner's peak memory. `--earlier` adds the rows of a table this command wrote
    before (read_report_table), for runs whose folders are gone; a folder's run of the same
    setting and rate replaces its earlier row."""
    parser = command_parser(
        ReportOptions, "python -m hydrappo.study report", "one table and one PNG from several study folders"
    )
    args = options_from(ReportOptions, parser.parse_args(argv))
    if not args.dirs and not args.earlier:
        parser.error("give study folders, --earlier tables, or both")
    for folder in args.dirs:  # each checked before anything is read or written
        if (problem := study_folder_problem(folder)) is not None:
            raise SystemExit(problem)
    rows = [row for folder in args.dirs for row in study_folder_rows(folder, args.curve)]
    new = {(r["setting"], r["rate"]) for r in rows}
    for earlier_table in args.earlier or []:
        try:
            earlier = read_report_table(earlier_table.read_text())
        except (OSError, ValueError) as error:
            raise SystemExit(f"--earlier {earlier_table}: {error}") from None
        rows += [r for r in earlier if (r["setting"], r["rate"]) not in new]
    rows.sort(key=lambda r: (r["setting"], r["lr"]))
    table = report_table(rows)
    best = best_run_per_setting(rows)
    if not best:  # refused before anything is written: an earlier table and PNG stay as they were
        raise SystemExit(
            f"no run in {', '.join(map(str, [*args.dirs, *(args.earlier or [])]))} logged {args.curve}: a held-out curve needs "
            "data.eval_prompts in the runs' config (or --eval_prompts in their study's --extra)"
        )
    args.table.write_text(table)
    print(table, end="")
    points = [{**r, "label": f"{r['setting']} lr {r['rate']}"} for r in best.values()]
    plot(
        points,
        "planner_peak_gib",
        "best",
        args.png,
        args.title,
        "planner's peak memory, Llama-3.1-8B bf16 (GiB)",
        f"best held-out {args.curve.rsplit('/', 1)[-1]} ({' and '.join(sorted({r['decoding'] for r in rows}))})",
        label="label",
        joined=False,
    )
    return 0
