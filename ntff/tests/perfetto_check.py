"""Parses a Perfetto trace with the official trace protos (the `perfetto` package on
PyPI) and fails when any packet, at any depth, holds a field those protos do not know.

Usage: perfetto_check.py TRACE.pftrace
Prints one JSON line: packets, slices (TYPE_SLICE_BEGIN events), track descriptors and
the first problems found. Exit status 0 when there are none, 1 otherwise.
"""

import json
import sys

from google.protobuf.unknown_fields import UnknownFieldSet
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent


def unknown_fields(message, path):
    problems = []
    unknown = UnknownFieldSet(message)
    if len(unknown):
        numbers = sorted({field.field_number for field in unknown})
        problems.append(f"{path}: unknown fields {numbers}")
    for descriptor, value in message.ListFields():
        if descriptor.message_type is None:
            continue
        if descriptor.is_repeated:
            for k, item in enumerate(value):
                problems += unknown_fields(item, f"{path}.{descriptor.name}[{k}]")
        else:
            problems += unknown_fields(value, f"{path}.{descriptor.name}")
    return problems


def main():
    with open(sys.argv[1], "rb") as f:
        data = f.read()
    trace = Trace()
    trace.ParseFromString(data)
    problems = []
    for k, packet in enumerate(trace.packet):
        problems += unknown_fields(packet, f"packet[{k}]")
        if len(problems) > 20:
            break
    slices = sum(
        1
        for p in trace.packet
        if p.HasField("track_event") and p.track_event.type == TrackEvent.TYPE_SLICE_BEGIN
    )
    descriptors = sum(1 for p in trace.packet if p.HasField("track_descriptor"))
    print(
        json.dumps(
            {
                "packets": len(trace.packet),
                "slices": slices,
                "track_descriptors": descriptors,
                "problems": problems[:20],
            }
        )
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
