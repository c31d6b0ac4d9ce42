"""Helpers shared by the benchmarks: environment and device, curve statistics, JSON, tables and plots. The paired
statistics are the engine's (`trl_groupopt.comparison.stats`); torch and TRL are imported inside the functions (fast `--help`)."""

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

from trl_groupopt.comparison.runs import jsonable
from trl_groupopt.comparison.stats import mean, mean_ci, paired_differences, t_quantile

__all__ = ["jsonable", "mean", "mean_ci", "paired_differences", "t_quantile"]

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT_DIR = REPO / "benchmarks" / "results"
_OFFLINE = dict(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                WANDB_DISABLED="true", TRANSFORMERS_VERBOSITY="error", HF_HUB_DISABLE_PROGRESS_BARS="1",
                HF_DATASETS_DISABLE_PROGRESS_BARS="1")  # fmt: skip


def setup_environment() -> None:
    """Offline Hub, quiet tokenizers and progress bars, no W&B: the benchmarks never touch the network."""
    for key, value in _OFFLINE.items():
        os.environ.setdefault(key, value)
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' deprecations raised inside TRL


def trainer_classes(method: str | None) -> tuple[Any, type]:
    """(config factory, trainer class) of a registry method; of TRL's own GRPOConfig and GRPOTrainer for None."""
    import trl

    from trl_groupopt import get_method

    if method is None:
        return trl.GRPOConfig, trl.GRPOTrainer
    return get_method(method).make_config, get_method(method).trainer_class


def resolve_device(name: str) -> str:
    """ "auto" -> "cuda" when a GPU is visible, else "cpu". On the CPU one torch thread (measured 50x faster on a
    2-core machine shared with other processes; results are identical)."""
    import torch

    name = ("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda was asked for, but torch sees no GPU.")
    if name == "cpu":
        torch.set_num_threads(1)
    return name


def describe_device(device: str) -> dict[str, Any]:
    """What ran the benchmark: accelerator, CPU, library versions (the JSON's "device")."""
    import torch

    info: dict[str, Any] = {"type": device, "python": platform.python_version(), "platform": platform.platform(),
                            "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
                            "torch": torch.__version__, "torch_threads": torch.get_num_threads()}  # fmt: skip
    for module in ("transformers", "trl", "accelerate"):
        info[module] = getattr(sys.modules.get(module) or __import__(module), "__version__", None)
    info["description"] = f"CPU {info['cpu']} x{os.cpu_count()}, {torch.get_num_threads()} torch thread(s)"
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(name=torch.cuda.get_device_name(0), total_memory_bytes=props.total_memory,
                    multiprocessors=props.multi_processor_count, cuda=torch.version.cuda)  # fmt: skip
        info["description"] = f"{info['name']} ({props.total_memory / 2**30:.0f} GiB), torch {torch.__version__}"
    return info


def command_line(module: str, argv: Sequence[str] | None = None) -> str:
    """The command that produced a result: `python -m <module>` with `argv` when `main(argv)` was called in-process
    (tests), else with this process's arguments (run as `python -m <module>`)."""
    return shlex.join(["python", "-m", module, *(sys.argv[1:] if argv is None else argv)])


def mean_curve(curves: Sequence[dict[str, list] | None]) -> dict[str, list]:
    """Per step every present curve (`{"steps", "values"}`) logged: the mean and 95% interval over the curves (the
    mean where the interval is undefined)."""
    present = [c for c in curves if c and c["steps"]]
    steps = sorted(set.intersection(*(set(c["steps"]) for c in present))) if present else []
    out: dict[str, list] = {"steps": steps, "mean": [], "low": [], "high": []}
    for step in steps:
        s = mean_ci([c["values"][c["steps"].index(step)] for c in present])
        for key in ("mean", "low", "high"):
            out[key].append(s["mean"] if s[key] is None else s[key])
    return out


def jitter2(curve: Sequence[float]) -> float:
    """Jitter2(m) = 1/(T-2) * sum_{t=1}^{T-2} |m_{t+2} - 2 m_{t+1} + m_t| of a curve m_1..m_T (lower: smoother; NaN
    for T < 3), as printed in Ding et al., 'Design Conditions for Intra-Group Learning of Sequence-Level Rewards: Token
    Gradient Cancellation', arXiv:2604.13088, Sec. 4.5, Eq. 20."""
    m = [float(x) for x in curve]
    if len(m) < 3:
        return float("nan")
    return sum(abs(m[t + 2] - 2.0 * m[t + 1] + m[t]) for t in range(len(m) - 2)) / (len(m) - 2)


def first_step_reaching(steps: Sequence[int], values: Sequence[float | None], threshold: float) -> int | None:
    """The first step whose value is >= threshold (None if never)."""
    return next(
        (int(s) for s, v in zip(steps, values) if v is not None and not math.isnan(v) and v >= threshold), None
    )


def write_json(path: Path, payload: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(jsonable(payload), indent=2, allow_nan=False) + "\n")
    return path


def pyplot():
    """matplotlib.pyplot with the Agg backend, or None when matplotlib is missing (then no PNG is written)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no PNG (the JSON can be plotted later with --from-runs).")
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
    unit = next((u for i, u in enumerate(("B", "KiB", "MiB")) if abs(num) < 1024 ** (i + 1)), "GiB")
    num /= 1024 ** ("B", "KiB", "MiB", "GiB").index(unit)
    return f"{num:.0f} {unit}" if unit == "B" else f"{num:.1f} {unit}"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table, aligned on column widths: printed and returned."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    text = "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])
    print(text, flush=True)
    return text
