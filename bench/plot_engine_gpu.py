"""Plot tick time against concurrent calls from the GPU results, Cadence against Kyutai's.

    python bench/plot_engine_gpu.py [STEP_JSON [CLOCK_JSON ...]]

Reads `bench/engine_gpu.py`'s result (step time back to back, both implementations, one run)
and `cadence bench engine` results (ticks on the real 80 ms clock, bf16 or fp8 KV), and writes
bench/results/engine_gpu.png. Needs matplotlib (`pip install matplotlib`), a bench-only tool.
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> int:
    step_file = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS / "engine_gpu.json"
    clock_files = [Path(p) for p in sys.argv[2:]] or sorted(RESULTS.glob("bench_engine_*.json"))
    steps = json.loads(step_file.read_text())
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for key, label, style in (
        ("cadence", "Cadence graph executor, bf16 KV (step, back to back)", "o-"),
        ("reference", "Kyutai moshi 0.2.13 + its CUDA graphs (same run)", "s--"),
    ):
        rows = [r for r in steps[key] if "graph" in r or "median_ms" in r]
        calls = [r["slots"] for r in rows]
        p99 = [r["graph"]["p99_ms"] if "graph" in r else r["p99_ms"] for r in rows]
        ax.plot(calls, p99, style, label=label + ", p99")
    for path in clock_files:
        result = json.loads(path.read_text())
        kv = "fp8" if "--kv-dtype fp8" in result["command"] else "bf16"
        served = [r for r in result["runs"] if r.get("zero_misses")]
        ax.plot(
            [r["calls"] for r in served],
            [r["tick_ms_recent"]["p99"] for r in served],
            "D" if kv == "bf16" else "^",
            markersize=8,
            label=f"cadence bench engine, {kv} KV, "
            + ", ".join(str(r["calls"]) for r in served)
            + " calls on the 80 ms clock, p99 (zero misses)",
        )
    ax.axhline(80, color="red", linewidth=1)
    ax.text(5, 82, "80 ms deadline", color="red")
    ax.set_xlabel("concurrent calls (Moshi 7B shapes, random weights, 2-min KV, rings full)")
    ax.set_ylabel("ms per tick")
    ax.set_ylim(0, 100)
    ax.set_title(steps["machine"]["gpu"] + ", torch " + steps["machine"]["torch"])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6.5, loc="lower right")
    fig.tight_layout()
    out = RESULTS / "engine_gpu.png"
    fig.savefig(out)
    sys.stdout.write(f"wrote {out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
