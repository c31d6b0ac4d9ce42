"""Helpers shared by the benchmarks: environment and device, statistics, JSON and plot output.

Only the standard library, torch and (for the plots) matplotlib; the Student-t interval is `trl_groupopt.stats`'s
(tabulated quantiles, no scipy). Everything heavy (TRL, transformers) is imported by
the scripts after argument parsing, so `--help` stays fast.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# The paired statistics are the engine's (`trl-groupopt compare`): one implementation, re-exported for the scripts.
from trl_groupopt.runs import jsonable
from trl_groupopt.stats import mean, mean_ci, paired_differences, t_quantile_975

__all__ = ["jsonable", "mean", "mean_ci", "paired_differences", "t_quantile_975"]

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT_DIR = REPO / "benchmarks" / "results"

#: The Jitter2 metric's source, written into every JSON that reports it.
JITTER2_CITATION = (
    "Ding et al., 'Design Conditions for Intra-Group Learning of Sequence-Level Rewards: Token Gradient "
    "Cancellation', arXiv:2604.13088, Eq. 20: Jitter2(m) = 1/(T-2) * sum_{t=1}^{T-2} |m_{t+2} - 2 m_{t+1} + m_t|"
)


def setup_environment() -> None:
    """Offline Hub, quiet tokenizers, no W&B: the benchmarks never touch the network."""
    for key, value in (
        ("HF_HUB_OFFLINE", "1"),
        ("HF_DATASETS_OFFLINE", "1"),
        ("TRANSFORMERS_OFFLINE", "1"),
        ("TOKENIZERS_PARALLELISM", "false"),
        ("WANDB_DISABLED", "true"),
        ("TRANSFORMERS_VERBOSITY", "error"),
        ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),  # transformers' "Loading weights" bar
        ("HF_DATASETS_DISABLE_PROGRESS_BARS", "1"),  # datasets' "Map" bar
    ):
        os.environ.setdefault(key, value)
    # transformers 5 deprecations (gradient_checkpointing -> activation_checkpointing) raised inside TRL: not ours.
    warnings.filterwarnings("ignore", category=FutureWarning)


def set_cpu_affinity(spec: str | None) -> None:
    """Pin this process (and the processes it starts) to CPUs "0-1,4" (Linux): lets the GPU benchmark and the CPU
    workers of another share one machine without competing for cores. Call before importing torch."""
    if not spec:
        return
    cpus: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    if not hasattr(os, "sched_setaffinity"):
        print(f"--cpu-affinity {spec}: not supported on this platform; ignored")
        return
    usable = cpus & os.sched_getaffinity(0)
    if not usable:
        print(f"--cpu-affinity {spec}: none of these CPUs is available here; ignored")
        return
    os.sched_setaffinity(0, usable)


def resolve_device(name: str) -> str:
    """ "auto" -> "cuda" when a GPU is visible, else "cpu". On CPU, one torch thread (measured 50x faster on a
    2-core machine shared with other processes; results are identical)."""
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda was asked for, but torch sees no GPU.")
    if name == "cpu":
        torch.set_num_threads(1)
    return name


def synchronize(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def describe_device(device: str) -> dict[str, Any]:
    """What ran the benchmark: accelerator, CPU, library versions (written as the JSON's top-level "device")."""
    import torch

    info: dict[str, Any] = {
        "type": device,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }
    for module in ("transformers", "trl", "accelerate"):
        try:
            info[module] = __import__(module).__version__
        except Exception:  # noqa: BLE001 - a version string is informative only
            info[module] = None
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(
            name=torch.cuda.get_device_name(0),
            total_memory_bytes=props.total_memory,
            multiprocessors=props.multi_processor_count,
            cuda=torch.version.cuda,
        )
        info["description"] = f"{info['name']} ({props.total_memory / 2**30:.0f} GiB), torch {torch.__version__}"
    else:
        info["description"] = f"CPU {info['cpu']} x{os.cpu_count()}, {torch.get_num_threads()} torch thread(s)"
    return info


def command_line(module: str | None = None, argv: Sequence[str] | None = None) -> str:
    """The command that produced a result, as a shell would re-run it: `python -m <module> <argv>` when a script's
    `main(argv)` was called in-process (tests), else this process's own command line."""
    if module is not None and argv is not None:
        return shlex.join(["python", "-m", module, *argv])
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if main_spec is not None and main_spec.name.startswith("benchmarks."):  # `python -m benchmarks.x`
        return shlex.join(["python", "-m", main_spec.name, *sys.argv[1:]])
    return shlex.join([os.path.basename(sys.executable), *sys.argv])


# ------------------------------------------------------------------------------------------------ statistics
def mean_curve(curves: Sequence[dict[str, list] | None]) -> dict[str, list]:
    """Per step, the mean and 95% interval over the seeds' curves (`{"steps", "values"}`), on the steps every curve
    logged; a missing or empty curve is left out. Where the interval is undefined (one seed) it is the mean."""
    present = [c for c in curves if c and c["steps"]]
    if not present:
        return {"steps": [], "mean": [], "low": [], "high": []}
    steps = sorted(set.intersection(*(set(c["steps"]) for c in present)))
    out: dict[str, list] = {"steps": steps, "mean": [], "low": [], "high": []}
    for step in steps:
        stats = mean_ci([c["values"][c["steps"].index(step)] for c in present])
        out["mean"].append(stats["mean"])
        out["low"].append(stats["low"] if stats["low"] is not None else stats["mean"])
        out["high"].append(stats["high"] if stats["high"] is not None else stats["mean"])
    return out


def jitter2(curve: Sequence[float]) -> float:
    """Second-order-difference jitter of a training curve, exactly as printed in the DFPO paper (Eq. 20):

        Jitter2(m) = 1/(T-2) * sum_{t=1}^{T-2} | m_{t+2} - 2 m_{t+1} + m_t |

    for a curve m_1..m_T (1-based). Lower is smoother. Undefined (NaN) for T < 3.
    Source: Ding et al., arXiv:2604.13088, Sec. 4.5, Eq. 20.
    """
    m = [float(x) for x in curve]
    T = len(m)
    if T < 3:
        return float("nan")
    total = 0.0
    for t in range(1, T - 1):  # t = 1..T-2, 1-based; m[t - 1] is m_t
        total += abs(m[t + 1] - 2.0 * m[t] + m[t - 1])
    return total / (T - 2)


def first_step_reaching(steps: Sequence[int], values: Sequence[float | None], threshold: float) -> int | None:
    """The first step whose value is >= threshold (None if never)."""
    for step, value in zip(steps, values):
        if value is not None and not math.isnan(value) and value >= threshold:
            return int(step)
    return None


def median(values: Sequence[float]) -> float:
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return float("nan")
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


# ------------------------------------------------------------------------------------------------ output
def write_json(path: Path, payload: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(jsonable(payload), indent=2, allow_nan=False) + "\n")
    return path


def pyplot():
    """matplotlib.pyplot with the Agg backend, or None when matplotlib is missing (then no PNG is written and the
    JSON can be re-plotted elsewhere with the script's --plot-from)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipping the PNG (re-plot later with --plot-from the JSON).")
        return None
    return plt


def save_figure(fig, path: Path, dpi: int) -> Path:
    """Lay out, write (creating the folder) and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def format_bytes(num: float | None) -> str:
    if num is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(num) < 1024 or unit == "GiB":
            return f"{num:.0f} {unit}" if unit == "B" else f"{num:.1f} {unit}"
        num /= 1024
    return f"{num:.1f} GiB"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table (also returned), aligned on column widths."""
    cells = [[str(h) for h in headers]] + [[("" if c is None else str(c)) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    text = "\n".join(lines)
    print(text, flush=True)
    return text
