// llmc/tensorboard.h — TensorBoard event files, written natively: no TensorFlow, no
// protobuf library, no dependency. `tensorboard --logdir OUT_DIR` shows the run's curves
// (train/*, val/loss, diloco/*) and its samples (the Text tab) while it trains.
//
// The file. Each run (each start, resumes included) creates a new file
//     OUT_DIR/events.out.tfevents.<unix time, 10 digits>.<hostname>
// (TensorBoard's own naming; ".1", ".2", ... is appended in the rare case that the name
// exists, e.g. a resume within the same second). TensorBoard reads every such file in a
// directory in name order, so a resumed run's file simply continues the curves. A file is
// a sequence of TFRecords, each one serialized tensorflow.Event (protobuf), and each record
// is flushed to the kernel as soon as it is written: a crash loses nothing already logged.
//
// A TFRecord, all integers little-endian:
//     u64  length                  bytes of data
//     u32  masked_crc(length)      CRC32C of the 8 length bytes, masked
//     u8   data[length]            the serialized Event
//     u32  masked_crc(data)        CRC32C of data, masked
// CRC32C is the Castagnoli CRC (reflected polynomial 0x82F63B78, init and final xor
// 0xFFFFFFFF; CRC32C("123456789") = 0xE3069283), masked = ((c >> 15) | (c << 17)) + 0xA282EAD8
// (mod 2^32), TFRecord's rule so that a CRC of data holding CRCs stays well spread.
//
// The protobuf encoding (field numbers from tensorflow/core/util/event.proto,
// tensorflow/core/framework/{summary,tensor,types}.proto). A field is its key, the varint
// (number << 3 | wire type), then its value: wire type 0 a varint (LEB128, 7 bits a byte,
// low first), 1 eight bytes (a double), 2 a varint length then that many bytes (a string or
// an embedded message), 5 four bytes (a float). Fields are written in this order, every
// field every time (the step too, even 0, except in the first record):
//
//   first record    Event { 09 wall_time:f64 | 1A len "brain.Event:2" }
//                   = wall_time (1, double), file_version (3, string)
//   scalars         Event { 09 wall_time:f64 | 10 step:varint | 2A len Summary }
//                   Summary { (0A len Value)... }             value (1), one per scalar
//                   Value { 0A len tag | 15 value:f32 }        tag (1), simple_value (2, float)
//   text            Event { 09 wall_time | 10 step | 2A len Summary { 0A len Value } }
//                   Value { 0A len tag | 42 len TensorProto | 4A len SummaryMetadata }
//                   TensorProto { 08 07 | 12 00 | 42 len text }
//                       dtype (1) = DT_STRING (7), tensor_shape (2) = {} (a scalar),
//                       string_val (8) = the text as UTF-8, each ill-formed sequence
//                       replaced by U+FFFD (EF BF BD), as TensorBoard decodes it strictly
//                   SummaryMetadata { 0A 06 PluginData { 0A 04 "text" } }
//                       plugin_data (1) = { plugin_name (1) = "text" }: the Text plugin's
//   restart         Event { 09 wall_time | 10 step | 3A 02 SessionLog { 08 01 } }
//                       session_log (7) = { status (1) = START (1) }
//
// wall_time is seconds since the Unix epoch (CLOCK_REALTIME). Scalars are float32, as
// simple_value is. One call of tb_scalars is one Event with all its values. Values that are
// not finite are left out (metrics.jsonl writes null; TensorBoard would plot them); an
// Event whose values are all left out is not written.
//
// The restart record: TensorBoard's Python loader (with file_version "brain.Event:2") drops
// every point it has read at a step >= S when it reads a SessionLog START at step S. A run
// that resumes from the checkpoint of step N, or rolls back to it, writes one at N + 1, so
// the steps logged after that checkpoint by the run that crashed do not stay in the curves
// twice; the later points count, as the later line of metrics.jsonl does. (Its Rust data
// server ignores the record and drops, per tag, the points at steps >= a step that comes
// again: the same for every tag the resumed run logs again.)
//
// Cost: a step's scalars are one record of ~180 bytes, one write(2): ~5 µs.
// Write errors (a full disk) are reported once and end the file's writing; training goes on.
#ifndef TRAIN_GPT_TENSORBOARD_H
#define TRAIN_GPT_TENSORBOARD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tb_writer tb_writer;

typedef struct {
    const char *tag;     // e.g. "train/loss"
    double value;        // written as float32; left out when not finite
} tb_value;

// Creates a new event file in out_dir (created if missing) and writes the file_version
// record; fatal if it cannot.
tb_writer *tb_open(const char *out_dir);
void tb_close(tb_writer *w);
// The file's path (for the user: "tensorboard --logdir ...").
const char *tb_path(const tb_writer *w);
// Every writer below accepts w = NULL and writes nothing.
// One Event at step with the finite ones of values[0..count).
void tb_scalars(tb_writer *w, int64_t step, const tb_value *values, int count);
void tb_scalar(tb_writer *w, const char *tag, int64_t step, double value);
// A string for the Text plugin.
void tb_text(tb_writer *w, const char *tag, int64_t step, const char *text);
// SessionLog START: TensorBoard forgets what it read at steps >= step.
void tb_restart(tb_writer *w, int64_t step);

// CRC32C (Castagnoli) of data, continuing from crc (0 to start); and TFRecord's mask of it.
uint32_t tb_crc32c(uint32_t crc, const void *data, size_t bytes);
uint32_t tb_crc32c_masked(uint32_t crc);

#ifdef __cplusplus
}
#endif

#endif
