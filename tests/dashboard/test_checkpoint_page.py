"""One checkpoint's page: summary, failure, operator rows, handle rows, stragglers, the Spark UI
links of its epoch, and the message for an unknown checkpoint."""

from __future__ import annotations

from typing import Any

from dash import html

from sparkpoint_dashboard import ids
from sparkpoint_dashboard.components.state_handles import (
    handle_kind,
    handle_rows,
    shared_text,
    short_checksum,
)
from sparkpoint_dashboard.components.timeline import Straggler
from sparkpoint_dashboard.pages.checkpoint import (
    checkpoint_views,
    failure_view,
    layout,
    not_found_text,
    operator_rows,
    output_text,
    pending_span,
    spark_link_view,
    stragglers_view,
    summary_cards,
    timeline_note,
)
from sparkpoint_dashboard.routing import Page, Route
from sparkpoint_dashboard.spark_ui import SparkJob
from sparkpoint_dashboard.units import DASH

NOW = 1_795_659_800_000
JOB = "ab8f9449"
UI = "http://driver:4040"
SPARK = {"ui-url": UI, "application-id": "local-1795659702825"}
CHECKSUM = "sha256:abf5025e50df281e0a154a35a57458277e8610f903959084ed09b594b5cef79a"


def _text(component: Any) -> str:
    if component is None:
        return ""
    if isinstance(component, (str, int, float)):
        return str(component)
    if isinstance(component, (list, tuple)):
        return "".join(_text(c) for c in component)
    return _text(getattr(component, "children", None))


def _find(component: Any, kind: type) -> list[Any]:
    if component is None or isinstance(component, (str, int, float)):
        return []
    if isinstance(component, (list, tuple)):
        return [found for child in component for found in _find(child, kind)]
    here = [component] if isinstance(component, kind) else []
    return here + _find(getattr(component, "children", None), kind)


def _checkpoint(**overrides: Any) -> dict[str, Any]:
    cp: dict[str, Any] = {
        "id": 5,
        "status": "COMPLETED",
        "is_savepoint": False,
        "checkpoint_type": "CHECKPOINT",
        "attempt": 1,
        "is_final": False,
        "trigger_timestamp": NOW - 5_000,
        "latest_ack_timestamp": NOW - 4_000,
        "end_to_end_duration": 1003.7,
        "state_size": 443,
        "checkpointed_size": 443,
        "alignment_buffered": 11_680,
        "num_subtasks": 4,
        "num_acknowledged_subtasks": 4,
        "external_path": f"file:///cp/{JOB}/chk-5",
        "committed": True,
        "commit_timestamp": NOW - 3_997,
        "failure_message": None,
        "failure_reason": None,
        "discarded": False,
        "epoch": 9,
        "spark-job-group": "sparkpoint-pv-count-a1-e9",
        "tasks": {
            "events": {
                "id": "events",
                "name": "events",
                "status": "COMPLETED",
                "state_size": 0,
                "checkpointed_size": 0,
                "end_to_end_duration": 628.0,
                "alignment_buffered": 0,
                "num_subtasks": 2,
                "num_acknowledged_subtasks": 2,
            },
            "pv": {
                "id": "pv",
                "name": "pv -> sink",
                "status": "COMPLETED",
                "state_size": 443,
                "checkpointed_size": 443,
                "end_to_end_duration": 947.0,
                "alignment_buffered": 11_680,
                "num_subtasks": 2,
                "num_acknowledged_subtasks": 2,
            },
        },
    }
    cp.update(overrides)
    return cp


def _subtask(index: int, e2e: float, handles: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "index": index,
        "status": "completed",
        "end_to_end_duration": e2e,
        "start_delay": e2e - 20.0,
        "alignment": {"duration": 5.0},
        "checkpoint": {"sync": 5.0, "async": 10.0},
        "declined_reason": None,
        "clock_flagged": False,
        "handles": handles or [],
    }


def _operators() -> list[dict[str, Any]]:
    keyed = {
        "path": f"file:///cp/{JOB}/chk-5/pv-0-a1-t168",
        "size": 247,
        "checksum": CHECKSUM,
        "key_group_start": 0,
        "key_group_end": 63,
        "inline": False,
    }
    return [
        {"id": "events", "name": "events", "subtasks": [_subtask(0, 615.0), _subtask(1, 628.0)]},
        {
            "id": "pv",
            "name": "pv -> sink",
            "subtasks": [_subtask(0, 100.0, [keyed]), _subtask(1, 947.0)],
        },
    ]


def test_summary_cards() -> None:
    stats, path = summary_cards(_checkpoint(), NOW)
    assert [_text(c.children[:2]) for c in stats.children] == [
        "StatusCOMPLETED",
        "Triggered02:23:15.000",
        "End-to-end1.00 s",
        "Checkpointed443 B",
        "Acknowledged4/4",
        "Alignment buffered11.4 KiB",
        "Attempt · epoch1 · 9",
    ]
    assert (
        _text(stats.children[2].children[2]) == "trigger to last ack; output committed 3 ms later"
    )
    assert _text(stats.children[1].children[2]) == "2026-11-26 UTC · 5.00 s ago"
    assert _text(stats.children[3].children[2]) == "state size 443 B"
    assert _text(path) == f"Path file:///cp/{JOB}/chk-5 · retained"


def test_summary_of_a_checkpoint_in_progress_counts_its_time_so_far() -> None:
    cp = _checkpoint(
        status="IN_PROGRESS",
        end_to_end_duration=None,
        epoch=None,
        num_acknowledged_subtasks=1,
        external_path=None,
        discarded=False,
    )
    stats, path = summary_cards(cp, NOW)
    assert _text(stats.children[2].children[1:]) == "5.00 sso far"
    assert _text(stats.children[4].children[1]) == "1/4"
    assert _text(stats.children[6].children[1]) == f"1 · {DASH}"
    assert _text(path) == f"Path {DASH} · retained"


def test_the_end_to_end_card_says_whether_and_when_the_sinks_committed() -> None:
    assert output_text(_checkpoint(), NOW) == "output committed 3 ms later"
    waiting = _checkpoint(committed=False, commit_timestamp=None)
    assert output_text(waiting, NOW) == "output NOT committed: waiting 4.00 s for the job's sinks"
    assert output_text(_checkpoint(commit_timestamp=None), NOW) == "output committed"
    for status in ("IN_PROGRESS", "FAILED"):
        assert output_text(_checkpoint(status=status, committed=False), NOW) is None
    stats, _ = summary_cards(waiting, NOW)
    assert _text(stats.children[2].children[2]) == (
        "trigger to last ack; output NOT committed: waiting 4.00 s for the job's sinks"
    )


def test_failure_shows_reason_and_message_only_when_failed() -> None:
    assert failure_view(_checkpoint()) is None
    failed = _checkpoint(
        status="FAILED",
        failure_reason="CHECKPOINT_DECLINED",
        failure_message="subtask pv #1 declined: state too large",
    )
    view = failure_view(failed)
    assert _text(view) == "Failed: CHECKPOINT_DECLINEDsubtask pv #1 declined: state too large"
    assert view is not None and "notice-error" in view.className
    assert _text(failure_view(_checkpoint(status="FAILED"))) == (
        "Failed: reason unknownThe control plane recorded no message."
    )


def test_not_found_names_the_job_and_the_checkpoint() -> None:
    assert not_found_text(JOB, 999, "checkpoint 999 of job ab8f9449 not found") == (
        "Checkpoint 999 of job ab8f9449 not found."
    )
    assert not_found_text(JOB, 999, "job ab8f9449 not found") == (
        "Cannot show checkpoint 999 of job ab8f9449: job ab8f9449 not found"
    )


def test_a_failed_checkpoint_says_so_on_its_timeline() -> None:
    failed = _checkpoint(
        status="FAILED", end_to_end_duration=None, failure_reason="CHECKPOINT_EXPIRED"
    )
    assert timeline_note(failed) == "checkpoint FAILED (CHECKPOINT_EXPIRED): snapshots discarded"
    assert timeline_note(_checkpoint()) is None
    figure = checkpoint_views(failed, _operators(), NOW)[3]
    assert [a["text"] for a in figure["layout"]["annotations"]][-1] == (
        "checkpoint FAILED (CHECKPOINT_EXPIRED): snapshots discarded"
    )
    stats, _ = summary_cards(failed, NOW)
    assert _text(stats.children[2].children[1:]) == f"{DASH}failed before completing"


def test_an_expired_checkpoint_spans_its_timeout_on_the_timeline_and_its_cards() -> None:
    # Nothing acknowledged before it expired: the hatched rows reach the failure, 2 s after
    # the trigger, not the 1 ms of an empty axis; the end-to-end card says how long it ran.
    expired = _checkpoint(
        status="FAILED",
        end_to_end_duration=None,
        failure_reason="CHECKPOINT_EXPIRED",
        failure_timestamp=NOW - 3_000,
        num_acknowledged_subtasks=0,
        **{"spark-job-group": None, "epoch": None},
    )
    unacknowledged = [
        {**op, "subtasks": [{**sub, "status": "pending_or_failed"} for sub in op["subtasks"]]}
        for op in _operators()
    ]
    figure = checkpoint_views(expired, unacknowledged, NOW)[3]
    hatched = next(t for t in figure["data"] if t["name"] == "not acknowledged")
    assert hatched["x"] == [2000.0] * 4
    stats, _ = summary_cards(expired, NOW)
    assert _text(stats.children[2].children[1:]) == "2.00 strigger to failure"
    assert _text(spark_link_view(expired, SPARK, [])) == (
        "Spark: no epoch carried this checkpoint's barrier before it failed."
    )


def test_operator_rows() -> None:
    stragglers = [Straggler("pv", "pv -> sink #1", 947.0, 523.5)]
    rows = operator_rows(_checkpoint(), stragglers)
    assert [r["operator"] for r in rows] == ["events", "pv -> sink"]
    pv = rows[1]
    assert (pv["id"], pv["status"], pv["acknowledged_text"]) == ("pv", "COMPLETED", "2/2")
    assert (pv["end_to_end_duration"], pv["end_to_end_duration_text"]) == (947.0, "947 ms")
    assert (pv["checkpointed_size_text"], pv["state_size_text"]) == ("443 B", "443 B")
    assert (pv["alignment_buffered"], pv["alignment_buffered_text"]) == (11_680, "11.4 KiB")
    assert [r["stragglers"] for r in rows] == [0, 1]


def test_handle_kinds_and_checksums() -> None:
    assert (
        handle_kind({"path": "file:///c/chk-5/pv-0", "key_group_start": 0, "key_group_end": 63})
        == "keyed state, key groups 0 to 63"
    )
    assert handle_kind({"path": "file:///c/chk-5/src-0"}) == "operator state"
    assert (
        handle_kind({"path": "s3://b/j/shared/ab12", "key_group_start": 64, "key_group_end": 127})
        == "shared file (keyed state, key groups 64 to 127)"
    )
    assert handle_kind({"path": None, "inline": True}) == "inline (in the metadata)"
    native = {
        "path": "file:///c/chk-6/pv-0-a1-t9/_manifest.json",
        "key_group_start": 0,
        "key_group_end": 63,
        "format": "rocksdb-native-v1",
        "shared_files": 3,
        "shared_size": 3_100_000,
    }
    assert handle_kind(native) == "keyed state, key groups 0 to 63, RocksDB files"
    assert shared_text(native) == "3 files, 3.0 MiB"
    assert shared_text({"shared_files": 0}) == DASH
    assert short_checksum(CHECKSUM) == "sha256:abf5025e50df"
    assert short_checksum(None) == DASH


def test_handle_rows() -> None:
    rows = handle_rows(_operators())
    assert rows == [
        {
            "id": "pv/0/0",
            "operator": "pv -> sink",
            "subtask": 0,
            "kind": "keyed state, key groups 0 to 63",
            "name": "pv-0-a1-t168",
            "path": f"file:///cp/{JOB}/chk-5/pv-0-a1-t168",
            "size": 247,
            "size_text": "247 B",
            "shared_size": 0,
            "shared_size_text": DASH,
            "checksum": CHECKSUM,
            "checksum_short": "sha256:abf5025e50df",
        }
    ]


def test_stragglers_view() -> None:
    assert _text(stragglers_view([])).startswith("No straggler")
    view = stragglers_view([Straggler("pv", "pv -> sink #1", 947.0, 523.5)])
    items = _find(view, html.Li)
    assert [_text(i) for i in items] == [
        "pv -> sink #1: 947 ms, +424 ms (1.8 times the operator's median of 524 ms)"
    ]
    assert items[0].className == "straggler"


def test_checkpoint_views_find_the_straggler() -> None:
    _summary, failure, operators, figure, stragglers, handles = checkpoint_views(
        _checkpoint(), _operators(), NOW
    )
    assert failure is None
    assert [r["stragglers"] for r in operators] == [0, 1]
    assert [_text(i) for i in _find(stragglers, html.Li)] == [
        "pv -> sink #1: 947 ms, +424 ms (1.8 times the operator's median of 524 ms)"
    ]
    assert figure["layout"]["yaxis"]["categoryarray"] == [
        "events #0",
        "events #1",
        "pv -> sink #0",
        "pv -> sink #1",
    ]
    assert [h["id"] for h in handles] == ["pv/0/0"]


def test_pending_span() -> None:
    assert pending_span(_checkpoint(), NOW) == 1003.7
    running = _checkpoint(status="IN_PROGRESS", end_to_end_duration=None)
    assert pending_span(running, NOW) == 5000.0
    assert pending_span(_checkpoint(status="FAILED", end_to_end_duration=None), NOW) is None
    failed = _checkpoint(status="FAILED", end_to_end_duration=None, failure_timestamp=NOW - 4_250)
    assert pending_span(failed, NOW) == 750.0


def test_spark_links_to_each_job_of_the_epoch() -> None:
    view = spark_link_view(
        _checkpoint(), SPARK, [SparkJob(17, "SUCCEEDED"), SparkJob(18, "RUNNING")]
    )
    assert _text(view) == (
        "Spark job group of epoch 9: sparkpoint-pv-count-a1-e9 · "
        "Spark job 17 (SUCCEEDED), Spark job 18 (RUNNING)"
    )
    assert [a.href for a in _find(view, html.A)] == [
        f"{UI}/jobs/job/?id=17",
        f"{UI}/jobs/job/?id=18",
    ]


def test_spark_link_when_the_ui_is_gone_or_unknown() -> None:
    gone = spark_link_view(_checkpoint(), SPARK, None)
    assert _text(gone).startswith(
        "Spark job group of epoch 9: sparkpoint-pv-count-a1-e9 · Spark UI not reachable"
    )
    assert _find(gone, html.A) == []
    assert _text(spark_link_view(_checkpoint(), None, None)).endswith("Spark UI address unknown")
    forgotten = spark_link_view(_checkpoint(), SPARK, [])
    assert "no Spark job of this group is left" in _text(forgotten)
    assert [a.href for a in _find(forgotten, html.A)] == [f"{UI}/jobs/"]
    no_epoch = spark_link_view(_checkpoint(**{"spark-job-group": None, "epoch": None}), SPARK, [])
    assert _text(no_epoch) == "Spark: no epoch has carried this checkpoint's barrier yet."


def test_spark_ui_of_a_host_not_allowed_is_named_not_linked() -> None:
    refused = spark_link_view(_checkpoint(), SPARK, None, allowed=False)
    assert _text(refused).endswith(
        f"Spark UI at {UI} not asked: its host is not loopback nor in "
        "SPARKPOINT_DASHBOARD_SPARK_UI_HOSTS"
    )
    assert _find(refused, html.A) == []


def test_layout_has_the_header_the_route_and_every_part() -> None:
    page = layout(Route(Page.CHECKPOINT, JOB, 5))
    found = {getattr(c, "id", None) for c in _find(page, object)}
    assert {
        ids.ROUTE,
        ids.JOB_TITLE,
        ids.CK_SUMMARY,
        ids.CK_FAILURE,
        ids.CK_OPERATORS_GRID,
        ids.CK_TIMELINE,
        ids.CK_STRAGGLERS,
        ids.CK_HANDLES_GRID,
        ids.CK_SPARK_LINK,
        ids.CK_SPARK_GROUP,
        ids.CK_MESSAGE,
    } <= found
    assert "Spark's shuffle is blocking" in _text(page)
