"""The checkpoints page: count cards, the latest checkpoints and restore, the percentile table
and the history table's rows (numbers to sort on, texts with units)."""

from __future__ import annotations

from typing import Any

from dash import dcc, html

from sparkpoint_dashboard import ids
from sparkpoint_dashboard.pages.checkpoints import (
    checkpoints_views,
    count_cards,
    failover_lines,
    history_row,
    history_rows,
    latest_view,
    layout,
    restore_lines,
    restore_timings,
    summary_rows,
)
from sparkpoint_dashboard.routing import Page, Route
from sparkpoint_dashboard.units import DASH

NOW = 1_795_659_800_000
JOB = "ab8f9449"


def _text(component: Any) -> str:
    """All the text of a component tree, in order."""
    if component is None:
        return ""
    if isinstance(component, (str, int, float)):
        return str(component)
    if isinstance(component, (list, tuple)):
        return "".join(_text(c) for c in component)
    return _text(getattr(component, "children", None))


def _find(component: Any, kind: type) -> list[Any]:
    """Every component of type ``kind`` in a tree (lists included)."""
    if component is None or isinstance(component, (str, int, float)):
        return []
    if isinstance(component, (list, tuple)):
        return [found for child in component for found in _find(child, kind)]
    here = [component] if isinstance(component, kind) else []
    return here + _find(getattr(component, "children", None), kind)


def _entry(cid: int, **overrides: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "id": cid,
        "status": "COMPLETED",
        "is_savepoint": False,
        "checkpoint_type": "CHECKPOINT",
        "attempt": 1,
        "is_final": False,
        "trigger_timestamp": NOW - 10_000,
        "latest_ack_timestamp": NOW - 9_430,
        "end_to_end_duration": 570.7,
        "state_size": 443,
        "checkpointed_size": 1536,
        "alignment_buffered": 11_160,
        "num_subtasks": 4,
        "num_acknowledged_subtasks": 4,
        "external_path": f"file:///tmp/cp/{JOB}/chk-{cid}",
        "failure_message": None,
        "failure_reason": None,
        "discarded": False,
        "epoch": 24,
        "spark-job-group": "sparkpoint-pv-count-a1-e24",
    }
    entry.update(overrides)
    return entry


def test_count_cards() -> None:
    cards = count_cards(
        {"restored": 2, "total": 1300, "in_progress": 1, "completed": 1290, "failed": 9}
    )
    assert [_text(c.children[:2]) for c in cards] == [
        "Triggered1,300",
        "In progress1",
        "Completed1,290",
        "Failed9",
        "Restored2",
    ]


def test_latest_completed_failed_and_savepoint() -> None:
    latest = {
        "completed": _entry(12),
        "failed": {
            **_entry(11, status="FAILED", end_to_end_duration=None),
            "failure_timestamp": NOW - 3_000,
            "failure_reason": "CHECKPOINT_EXPIRED",
            "failure_message": "checkpoint 11 expired after 10000 ms",
        },
        "savepoint": _entry(7, is_savepoint=True, external_path="file:///sp/savepoint-7"),
        "restored": None,
    }
    completed, failed, savepoint, restored = latest_view(latest, JOB, NOW)
    assert _text(completed) == (
        "Latest completed#12 · 571 ms · 1.5 KiB2026-11-26 02:23:10.570 UTC (9.43 s ago)"
        f"file:///tmp/cp/{JOB}/chk-12"
    )
    assert _find(completed, dcc.Link)[0].href == f"/jobs/{JOB}/checkpoints/12"
    assert _text(failed) == (
        "Latest failed#11 · CHECKPOINT_EXPIRED2026-11-26 02:23:17.000 UTC (3.00 s ago)"
        "checkpoint 11 expired after 10000 ms"
    )
    assert (
        _text(savepoint) == "Latest savepoint#7 · 2026-11-26 02:23:10.000 UTCfile:///sp/savepoint-7"
    )
    assert _text(restored) == "Latest restorenever restored"


def test_latest_when_nothing_happened_yet() -> None:
    blocks = latest_view({"completed": None, "failed": None, "savepoint": None}, JOB, NOW)
    assert [_text(b) for b in blocks] == [
        "Latest completednone yet",
        "Latest failednone",
        "Latest savepointnone",
        "Latest restorenever restored",
    ]


def test_restore_lines() -> None:
    fresh = {
        "id": None,
        "restore_timestamp": NOW - 60_000,
        "is_savepoint": False,
        "external_path": None,
    }
    assert _text(restore_lines(fresh, JOB, NOW)) == (
        "started from scratch (no checkpoint)2026-11-26 02:22:20.000 UTC (1 min 00 s ago)"
    )
    from_cp = {
        "id": 9,
        "restore_timestamp": NOW - 2_000,
        "is_savepoint": False,
        "external_path": "file:///cp/chk-9",
    }
    lines = restore_lines(from_cp, JOB, NOW)
    assert _text(lines) == (
        "from checkpoint #92026-11-26 02:23:18.000 UTC (2.00 s ago)"
        "timings: the first epoch after the restore has not reported yet"
        "file:///cp/chk-9"
    )
    assert _find(lines, dcc.Link)[0].href == f"/jobs/{JOB}/checkpoints/9"
    ended = {**from_cp, "epoch_reported": True}  # the first epoch ended without timings
    assert restore_timings(ended) == "timings: none reported (no keyed state was restored)"
    reported = {**from_cp, "state_restore_duration": 84.5, "first_record_timestamp": NOW - 1_300}
    assert restore_timings(reported) == (
        "state restored in 84 ms (slowest subtask); first record 700 ms after the restore"
    )
    skewed = {**reported, "first_record_timestamp": NOW - 2_500}  # executors' clock behind
    assert restore_timings(skewed).endswith("first record at 2026-11-26 02:23:17.500 UTC")
    from_sp = {
        "id": None,
        "restore_timestamp": NOW - 2_000,
        "is_savepoint": True,
        "external_path": "file:///sp/savepoint-3",
    }
    assert _text(restore_lines(from_sp, JOB, NOW)).startswith("from savepoint 2026-11-26")


def test_summary_rows_have_units_and_every_percentile() -> None:
    summary = {
        "end_to_end_duration": {
            "min": 495.6,
            "max": 12_011.2,
            "avg": 823.7,
            "p50": 889.0,
            "p90": 1008.9,
            "p95": 1011.2,
            "p99": 1011.2,
            "p999": 1011.2,
        },
        "state_size": {
            "min": 443,
            "max": 443,
            "avg": 443.0,
            "p50": 443.0,
            "p90": 443.0,
            "p95": 443.0,
            "p99": 443.0,
            "p999": 443.0,
        },
        "checkpointed_size": {
            "min": 1024,
            "max": 3 << 20,
            "avg": 2048.0,
            "p50": 2048.0,
            "p90": 4096.0,
            "p95": 4096.0,
            "p99": 4096.0,
            "p999": 4096.0,
        },
    }
    assert summary_rows(summary) == [
        [
            "End-to-end duration",
            "496 ms",
            "824 ms",
            "889 ms",
            "1.01 s",
            "1.01 s",
            "1.01 s",
            "12.0 s",
        ],
        [
            "Checkpointed size",
            "1.0 KiB",
            "2.0 KiB",
            "2.0 KiB",
            "4.0 KiB",
            "4.0 KiB",
            "4.0 KiB",
            "3.0 MiB",
        ],
        ["State size", "443 B", "443 B", "443 B", "443 B", "443 B", "443 B", "443 B"],
        ["Alignment buffered", *[DASH] * 7],  # no completed checkpoint reported it
    ]


def test_history_row_numbers_and_texts() -> None:
    row = history_row(_entry(12), JOB)
    assert (row["link"], row["link_href"]) == ("#12", f"/jobs/{JOB}/checkpoints/12")
    assert (row["id"], row["row_id"]) == (12, "12")
    assert (row["status"], row["type"], row["attempt"]) == ("COMPLETED", "checkpoint", 1)
    assert row["status_style"] == {"color": "#15803d", "fontWeight": "600"}
    assert (row["trigger_timestamp"], row["trigger_timestamp_text"]) == (
        NOW - 10_000,
        "2026-11-26 02:23:10.000",
    )
    assert (row["end_to_end_duration"], row["end_to_end_duration_text"]) == (570.7, "571 ms")
    assert (row["checkpointed_size"], row["checkpointed_size_text"]) == (1536, "1.5 KiB")
    assert (row["state_size"], row["state_size_text"]) == (443, "443 B")
    assert (row["acknowledged"], row["acknowledged_text"]) == (4, "4/4")
    assert (row["alignment_buffered"], row["alignment_buffered_text"]) == (11_160, "10.9 KiB")
    assert (row["failure_reason"], row["external_path"], row["retained"]) == (
        "",
        f"file:///tmp/cp/{JOB}/chk-12",
        "retained",
    )


def test_history_row_of_a_failed_final_savepoint() -> None:
    row = history_row(
        _entry(
            5,
            status="FAILED",
            is_savepoint=True,
            is_final=True,
            end_to_end_duration=None,
            num_acknowledged_subtasks=1,
            failure_reason="CHECKPOINT_DECLINED",
            failure_message="subtask pv #1 declined: state too large",
            failure_timestamp=NOW - 10_000 + 1_250,
            external_path=None,
            discarded=True,
        ),
        JOB,
    )
    assert (row["status"], row["type"]) == ("FAILED", "savepoint (final)")
    assert row["status_style"]["color"] == "#dc2626"
    # How long it ran until it failed, as Flink's history shows a failed checkpoint's.
    assert (row["end_to_end_duration"], row["end_to_end_duration_text"]) == (1250.0, "1.25 s")
    assert row["acknowledged_text"] == "1/4"
    assert (row["failure_reason"], row["failure_message"]) == (
        "CHECKPOINT_DECLINED",
        "subtask pv #1 declined: state too large",
    )
    assert (row["external_path"], row["retained"]) == ("", "discarded")


def test_history_rows_newest_first() -> None:
    rows = history_rows([_entry(3), _entry(10), _entry(7)], JOB)
    assert [r["id"] for r in rows] == [10, 7, 3]


def test_views_of_an_answer() -> None:
    answer = {"counts": {"total": 1}, "summary": {}, "latest": {}, "history": [_entry(1)]}
    cards, latest, figure, table, rows = checkpoints_views(answer, JOB, NOW)
    assert len(cards) == 5 and len(latest) == 4
    assert [t["name"] for t in figure["data"]] == ["COMPLETED", "checkpointed size"]
    assert isinstance(table, html.Table)
    assert [r["id"] for r in rows] == [1]


def test_layout_has_the_header_the_route_and_every_part() -> None:
    page = layout(Route(Page.CHECKPOINTS, JOB))
    found = {getattr(c, "id", None) for c in _find(page, object)}
    assert {
        ids.ROUTE,
        ids.JOB_TITLE,
        ids.CP_COUNTS,
        ids.CP_LATEST,
        ids.CP_HISTORY_CHART,
        ids.CP_SUMMARY,
        ids.CP_HISTORY_GRID,
        ids.CP_MESSAGE,
    } <= found
    assert page.children[0].className == "job-header"


def test_failover_lines() -> None:
    plain = {"id": 12, "is_savepoint": False, "external_path": "x", "origin": None}
    lines = failover_lines({**plain, "passed_over": []}, JOB)
    assert _text(lines) == "checkpoint #12"
    assert _find(lines, dcc.Link)[0].href == f"/jobs/{JOB}/checkpoints/12"
    rewound = {
        **plain,
        "id": 5,
        "origin": {"id": 5, "external_path": "file:///cp/chk-5", "next_id": 10},
        "passed_over": [9, 8, 7, 6],
    }
    assert _text(failover_lines(rewound, JOB)) == (
        "checkpoint #5the line since checkpoint #5 (a restore or --from-checkpoint)"
        "not restored by a failover (a restore went back past them): #9, #8, #7, #6"
    )
    by_path = {
        "id": 3,
        "is_savepoint": None,
        "external_path": "file:///sp/savepoint-3",
        "origin": {"id": 3, "external_path": "file:///sp/savepoint-3", "next_id": 4},
        "passed_over": [],
    }
    assert _text(failover_lines(by_path, JOB)) == (
        "checkpoint #3 by its path (the checkpoint the job's line started from)"
        "file:///sp/savepoint-3the line since checkpoint #3 (a restore or --from-checkpoint)"
    )
    nothing = {"id": None, "is_savepoint": False, "external_path": None, "origin": None}
    assert _text(failover_lines({**nothing, "passed_over": []}, JOB)) == (
        "the beginning (no checkpoint retained yet)"
    )
    blocks = latest_view({"failover": {**plain, "passed_over": []}}, JOB, NOW)
    assert _text(blocks[-1]) == "A failover restorescheckpoint #12"


def test_a_checkpoint_kept_for_other_jobs_links_them() -> None:
    kept = [{"id": 3, "external_path": "file:///c/chk-3", "jobs": ["fork-1", "fork-2"]}]
    blocks = latest_view({"origin_of": kept}, JOB, NOW)
    assert _text(blocks[-1]) == (
        "Other jobs' restore pointscheckpoint #3: fork-1, fork-2 would restore it in a "
        "failover (kept until they have a checkpoint of their own)"
    )
    assert [link.href for link in _find(blocks[-1], dcc.Link)] == [
        f"/jobs/{JOB}/checkpoints/3",
        "/jobs/fork-1",
        "/jobs/fork-2",
    ]
    assert "Other jobs" not in _text(latest_view({"origin_of": []}, JOB, NOW)[-1])
    savepoint = [{**kept[0], "is_savepoint": True}]
    assert "restore pointssavepoint #3: fork-1" in _text(
        latest_view({"origin_of": savepoint}, JOB, NOW)[-1]
    )
