#!/usr/bin/env python3
"""test/tb_reader.py — an independent reader of the TensorBoard event files train_gpt writes
(llmc/tensorboard.h, docs/formats.md#tensorboard-event-files). Standard library only: no
TensorFlow, no TensorBoard, no protobuf package.

It checks every TFRecord's two CRC32Cs, decodes each tensorflow.Event with its own varint /
field parser, and is strict: every message must hold exactly the fields the format names, in
its order and with its wire types, so a file that TensorBoard would read differently (or not
at all) fails here. Field numbers: tensorflow/core/util/event.proto,
tensorflow/core/framework/{summary,tensor,types}.proto.

    tb_reader.py FILE...            one JSON line per record (offset, kind, step, values)
    tb_reader.py --merged DIR       the run as TensorBoard shows it: every events file of DIR in
                                    name order, points at steps >= S dropped at each
                                    SessionLog START at step S; one JSON object

Exit status 1 with one line "tb_reader: FILE: ..." on the first bad record (CRC mismatch,
truncation, a message not as documented).
"""
import json
import os
import struct
import sys

# ---------------------------------------------------------------- CRC32C (Castagnoli)
_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ (0x82F63B78 if _c & 1 else 0)
    _TABLE.append(_c)


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked_crc32c(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283, "CRC32C check value"


class BadFile(Exception):
    pass


# ---------------------------------------------------------------- protobuf wire format
def read_varint(buf, pos):
    value, shift = 0, 0
    while True:
        if pos >= len(buf):
            raise BadFile("truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise BadFile("varint longer than 10 bytes")


def fields(buf):
    """[(field number, wire type, value)]: an int (varint), bytes (length-delimited, or the raw
    8 / 4 bytes of a fixed64 / fixed32)."""
    out, pos = [], 0
    while pos < len(buf):
        key, pos = read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise BadFile("field number 0")
        if wire == 0:
            value, pos = read_varint(buf, pos)
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            if pos + n > len(buf):
                raise BadFile("truncated fixed field")
            value, pos = buf[pos:pos + n], pos + n
        elif wire == 2:
            n, pos = read_varint(buf, pos)
            if pos + n > len(buf):
                raise BadFile("truncated length-delimited field")
            value, pos = buf[pos:pos + n], pos + n
        else:
            raise BadFile(f"wire type {wire} (groups are not used)")
        out.append((number, wire, value))
    return out


def expect(what, got, layout):
    """The message's (field, wire type) sequence must be exactly layout."""
    shape = [(n, w) for n, w, _ in got]
    if shape != layout:
        raise BadFile(f"{what}: fields {shape}, expected {layout}")
    return [v for _, _, v in got]


WIRE_VARINT, WIRE_FIXED64, WIRE_BYTES, WIRE_FIXED32 = 0, 1, 2, 5
DT_STRING = 7


def decode_value(buf):
    """A Summary.Value: ("scalar", tag, float) or ("text", tag, bytes)."""
    f = fields(buf)
    if [n for n, _, _ in f] == [1, 2]:  # tag, simple_value
        tag, raw = expect("Summary.Value", f, [(1, WIRE_BYTES), (2, WIRE_FIXED32)])
        return "scalar", tag.decode("utf-8"), struct.unpack("<f", raw)[0]
    # tag, tensor (8), metadata (9)
    tag, tensor, metadata = expect("Summary.Value", f, [(1, WIRE_BYTES), (8, WIRE_BYTES), (9, WIRE_BYTES)])
    dtype, shape, text = expect("TensorProto", fields(tensor), [(1, WIRE_VARINT), (2, WIRE_BYTES), (8, WIRE_BYTES)])
    if dtype != DT_STRING or shape != b"":
        raise BadFile(f"TensorProto: dtype {dtype}, shape {shape!r}; expected DT_STRING (7), a scalar")
    (plugin_data,) = expect("SummaryMetadata", fields(metadata), [(1, WIRE_BYTES)])
    (plugin_name,) = expect("PluginData", fields(plugin_data), [(1, WIRE_BYTES)])
    if plugin_name != b"text":
        raise BadFile(f"PluginData: plugin_name {plugin_name!r}, expected 'text'")
    return "text", tag.decode("utf-8"), text


def decode_event(buf, first):
    f = fields(buf)
    if first:
        wall, version = expect("first Event", f, [(1, WIRE_FIXED64), (3, WIRE_BYTES)])
        return {"kind": "file_version", "wall_time": struct.unpack("<d", wall)[0], "file_version": version.decode()}
    what = f[2][0] if len(f) == 3 else None
    if what == 5:  # summary
        wall, step, summary = expect("Event", f, [(1, WIRE_FIXED64), (2, WIRE_VARINT), (5, WIRE_BYTES)])
        members = fields(summary)
        values = [decode_value(v) for v in expect("Summary", members, [(1, WIRE_BYTES)] * len(members))]
        if not values:
            raise BadFile("Summary without values")
        kinds = {k for k, _, _ in values}
        if kinds == {"scalar"}:
            event = {"kind": "scalars", "values": {t: v for _, t, v in values}}
        elif kinds == {"text"} and len(values) == 1:
            event = {"kind": "text", "tag": values[0][1], "text": values[0][2]}
        else:
            raise BadFile("Summary mixes scalars and text")
    elif what == 7:  # session_log
        wall, step, log = expect("Event", f, [(1, WIRE_FIXED64), (2, WIRE_VARINT), (7, WIRE_BYTES)])
        (status,) = expect("SessionLog", fields(log), [(1, WIRE_VARINT)])
        if status != 1:
            raise BadFile(f"SessionLog status {status}, expected START (1)")
        event = {"kind": "restart"}
    else:
        raise BadFile(f"Event fields {[(n, w) for n, w, _ in f]}: neither a summary nor a session_log")
    if step >= 1 << 63:
        step -= 1 << 64
    event["wall_time"] = struct.unpack("<d", wall)[0]
    event["step"] = step
    return event


# ---------------------------------------------------------------- TFRecord framing
def read_events(path):
    """Every record of one file, decoded; raises BadFile naming the record."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise BadFile(f"{path}: cannot read: {e.strerror}")
    pos, index, events = 0, 0, []
    while pos < len(data):
        where = f"{path}: record {index} at offset {pos}"
        if pos + 12 > len(data):
            raise BadFile(f"{where}: truncated header ({len(data) - pos} of 12 bytes)")
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if length_crc != masked_crc32c(header):
            raise BadFile(f"{where}: length CRC mismatch (stored {length_crc:08x}, computed {masked_crc32c(header):08x})")
        if pos + 12 + length + 4 > len(data):
            raise BadFile(f"{where}: truncated data ({len(data) - pos - 12} of {length + 4} bytes)")
        body = data[pos + 12:pos + 12 + length]
        (data_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        if data_crc != masked_crc32c(body):
            raise BadFile(f"{where}: data CRC mismatch (stored {data_crc:08x}, computed {masked_crc32c(body):08x})")
        try:
            event = decode_event(body, index == 0)
        except BadFile as e:
            raise BadFile(f"{where}: {e}")
        if index == 0 and event["file_version"] != "brain.Event:2":
            raise BadFile(f"{where}: file_version {event['file_version']!r}, expected 'brain.Event:2'")
        event["offset"], event["length"] = pos, length
        events.append(event)
        pos += 16 + length
        index += 1
    if not events:
        raise BadFile(f"{path}: empty file (no file_version record)")
    return events


def event_files(directory):
    return sorted(os.path.join(directory, n) for n in os.listdir(directory) if "tfevents" in n)


def merged(directory):
    """TensorBoard's view of a run directory: files in name order; a SessionLog START at step S
    drops the points read so far at steps >= S; a later point at the same step replaces an
    earlier one. {"scalars": {tag: {step: value}}, "texts": {tag: {step: text}}}."""
    points = []  # (kind, tag, step, value) in reading order
    for path in event_files(directory):
        for e in read_events(path):
            if e["kind"] == "restart":
                points = [p for p in points if p[2] < e["step"]]
            elif e["kind"] == "scalars":
                points += [("scalars", t, e["step"], v) for t, v in e["values"].items()]
            elif e["kind"] == "text":
                points.append(("texts", e["tag"], e["step"], e["text"]))
    view = {"scalars": {}, "texts": {}}
    for kind, tag, step, value in points:
        view[kind].setdefault(tag, {})[step] = value
    return view


def printable(event):
    if "text" in event:
        event = dict(event, text=event["text"].decode("utf-8", "backslashreplace"))
    return event


def main(argv):
    try:
        if argv[:1] == ["--merged"] and len(argv) == 2:
            view = merged(argv[1])
            for tag in view["texts"]:
                view["texts"][tag] = {s: t.decode("utf-8", "backslashreplace") for s, t in view["texts"][tag].items()}
            print(json.dumps(view, sort_keys=True))
            return 0
        if not argv or argv[0].startswith("-"):
            print(__doc__, file=sys.stderr)
            return 2
        for path in argv:
            for e in read_events(path):
                print(json.dumps(printable(e)))
    except BadFile as e:
        print(f"tb_reader: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
