"""Sparkpoint: Flink's exactly-once checkpointing for PySpark jobs.

What a job author needs is importable from the package root::

    from sparkpoint import StreamExecutionEnvironment, GeneratorSource, FileSink

The names resolve on first use (PEP 562), so ``import sparkpoint.protocol`` — what the control
plane imports — does not load the job library (numpy, the connectors, the state backends).
"""

from __future__ import annotations

import importlib
from typing import Any

# Public name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    # building and running a job
    "StreamExecutionEnvironment": "sparkpoint.graph",
    "DataStream": "sparkpoint.graph",
    "KeyedStream": "sparkpoint.graph",
    "WindowedStream": "sparkpoint.graph",
    "JobResult": "sparkpoint.runtime.driver",
    "Batch": "sparkpoint.records",
    # keyed functions, their context, state and timers
    "KeyedProcessFunction": "sparkpoint.functions",
    "KeyedContext": "sparkpoint.functions",
    "KeyedCoProcessFunction": "sparkpoint.functions",
    "OutputTag": "sparkpoint.functions",
    # the broadcast pattern: a keyed stream connected with a broadcast stream
    "BroadcastStream": "sparkpoint.graph",
    "BroadcastConnectedStream": "sparkpoint.graph",
    "KeyedBroadcastProcessFunction": "sparkpoint.broadcast",
    "KeyedReadOnlyContext": "sparkpoint.broadcast",
    "KeyedBroadcastContext": "sparkpoint.broadcast",
    "BroadcastState": "sparkpoint.broadcast_state",
    "ReadOnlyBroadcastState": "sparkpoint.broadcast_state",
    "ReadOnlyBroadcastStateError": "sparkpoint.broadcast_state",
    "TimerService": "sparkpoint.timers",
    "ValueStateDescriptor": "sparkpoint.state.descriptors",
    "ListStateDescriptor": "sparkpoint.state.descriptors",
    "MapStateDescriptor": "sparkpoint.state.descriptors",
    "ValueState": "sparkpoint.state.descriptors",
    "ListState": "sparkpoint.state.descriptors",
    "MapState": "sparkpoint.state.descriptors",
    "TypeSerializer": "sparkpoint.state.serializers",
    "PickleSerializer": "sparkpoint.state.serializers",
    "JsonSerializer": "sparkpoint.state.serializers",
    "Int64Serializer": "sparkpoint.state.serializers",
    "Float64Serializer": "sparkpoint.state.serializers",
    "Utf8Serializer": "sparkpoint.state.serializers",
    "BytesSerializer": "sparkpoint.state.serializers",
    # operator (non-keyed) state of a function
    "CheckpointedFunction": "sparkpoint.operator_state",
    "FunctionInitializationContext": "sparkpoint.operator_state",
    "FunctionSnapshotContext": "sparkpoint.operator_state",
    "OperatorStateStore": "sparkpoint.operator_state",
    "OperatorListState": "sparkpoint.operator_state",
    # event time and windows
    "BoundedOutOfOrdernessWatermarks": "sparkpoint.watermarks",
    "TumblingEventTimeWindows": "sparkpoint.windows",
    "SlidingEventTimeWindows": "sparkpoint.windows",
    # connectors
    "Source": "sparkpoint.connectors.sources",
    "GeneratorSource": "sparkpoint.connectors.sources",
    "FileSource": "sparkpoint.connectors.sources",
    "RedisStreamSource": "sparkpoint.connectors.redis_source",
    "RedisListSource": "sparkpoint.connectors.unprotected",
    "TwoPhaseCommitSink": "sparkpoint.connectors.sinks",
    "FileSink": "sparkpoint.connectors.sinks",  # also s3:// and other object stores
    "ObjectStoreFileSink": "sparkpoint.connectors.object_store",
    "SqlSink": "sparkpoint.connectors.sql_sink",
    "UpsertSink": "sparkpoint.connectors.upsert_sink",
    "WriteAheadSink": "sparkpoint.connectors.wal_sink",
    "JsonLinesWriteAheadSink": "sparkpoint.connectors.wal_sink",
    "AppendFileSink": "sparkpoint.connectors.unprotected",
    "Guarantee": "sparkpoint.guarantees",
    # errors
    "SparkpointError": "sparkpoint.errors",
    "ConfigurationError": "sparkpoint.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sparkpoint' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup does not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
