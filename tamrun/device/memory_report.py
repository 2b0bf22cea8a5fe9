"""The memory report: predicted vs measured peaks, OOM events and right-sizing recommendations."""

from __future__ import annotations

from typing import List, Optional

from tamrun.memory.guard import OomLog
from tamrun.memory.oracle import Plan
from tamrun.device.profiler import PhaseRecorder
from tamrun.config.units import format_size


def recommendations(plan: Plan, measured_working_peak: int, oom_log: OomLog, limit: Optional[int]) -> List[str]:
    """Plain-language advice: the smallest limit, what the plan needs, what would use less."""
    advice = [
        f"The smallest memory.limit this run fits in is {format_size(plan.minimal_limit)} "
        f"(one group and one row per chunk: slower); its current chunks need memory.limit >= {format_size(plan.plan_limit)}.",
    ]
    if measured_working_peak and plan.predicted_peak:
        ratio = measured_working_peak / plan.predicted_peak
        advice.append(f"Measured working peak {format_size(measured_working_peak)} = {ratio:.2f} x the predicted "
                      f"{format_size(plan.predicted_peak)}.")
    if plan.route == "direct":
        advice.append("solver=cg would drop the D x D systems (2 D^2 per group) for about 8 D per group, at the cost "
                      "of iterations; memory.max_chunk_rows lower would shrink the design chunks.")
    elif plan.cache_design:
        advice.append("The CG route keeps W Phi between iterations; a lower memory.limit makes it rebuild Phi "
                      "chunk by chunk at every product instead (less memory, more time).")
    if oom_log.retries:
        advice.append(f"{oom_log.retries} OOM retr{'y' if oom_log.retries == 1 else 'ies'} shrank the chunks: "
                      f"memory.limit={format_size(plan.plan_limit)} or lower memory.chunk_fraction_* would plan "
                      "smaller chunks from the start.")
    if limit is not None and measured_working_peak > limit:
        advice.append(f"The measured working peak exceeded memory.limit={format_size(limit)}: raise "
                      "memory.overhead_factor so the oracle plans with more headroom.")
    return advice


def memory_report(plan: Plan, recorder: PhaseRecorder, oom_log: OomLog, limit: Optional[int],
                  tracker_peak: int = 0) -> dict:
    """The report as a JSON-ready dict (plan, phases, snapshots, OOM events, recommendations)."""
    measured = recorder.working_peak()
    return {
        "limit": limit,
        "predicted_peak": plan.predicted_peak,
        "measured_working_peak": measured,
        "tracker_peak": tracker_peak,
        "minimal_limit": plan.minimal_limit,
        "plan_limit": plan.plan_limit,
        "plan": plan.as_dict(),
        **recorder.as_dict(),
        "oom_events": oom_log.as_dicts(),
        "recommendations": recommendations(plan, measured, oom_log, limit),
    }


def report_text(report: dict, plan: Plan) -> str:
    """The report as text: plan, per-phase table, OOM events, recommendations."""
    lines = ["# Memory report", "", plan.describe(), ""]
    lines.append(f"{'phase':<10} {'seconds':>9} {'held at start':>14} {'peak':>12} {'working peak':>13}")
    for name, phase in report["phases"].items():
        lines.append(f"{name:<10} {phase['seconds']:>9.3f} {format_size(phase['start_bytes']):>14} "
                     f"{format_size(phase['peak_bytes']):>12} {format_size(phase['working_peak']):>13}")
    lines.append("(working peak: the tensor bytes a metered phase created, for solve and predict (on CUDA the "
                 "allocator's peak above the phase's start); the peak above the phase's start for the others)")
    lines += ["", f"predicted working peak {format_size(report['predicted_peak'])}; measured "
              f"{format_size(report['measured_working_peak'])}; tracker peak {format_size(report['tracker_peak'])}"
              + (f"; memory.limit {format_size(report['limit'])}" if report["limit"] else ""), ""]
    if report["oom_events"]:
        lines.append("OOM events:")
        lines += [f"  {e['phase']}: chunk {e['size_before']} -> {e['size_after']} after {e['delay_ms']:.0f} ms "
                  f"({e['error']})" for e in report["oom_events"]]
        lines.append("")
    lines.append("Recommendations:")
    lines += [f"  - {text}" for text in report["recommendations"]]
    return "\n".join(lines) + "\n"
