// llmc/plot.h — `train_gpt plot`: one self-contained SVG dashboard (loss, lr, gradient norm,
// tok/s, MFU and, for DiLoCo runs, the outer syncs) drawn from the metrics.jsonl of one or
// more run directories, so that a cluster without Python can still show how a run went.
// docs/plot.md describes the panels; docs/formats.md the lines it reads.
#ifndef TRAIN_GPT_PLOT_H
#define TRAIN_GPT_PLOT_H

#ifdef __cplusplus
extern "C" {
#endif

// `train_gpt plot OUT_DIR [OUT_DIR...] [-o FILE.svg]`, argv[0] being "plot". Writes
// FILE.svg (default: the first OUT_DIR's dashboard.svg) and returns 0; a missing directory,
// an unreadable, empty or malformed metrics.jsonl or an unwritable output end in fail().
int plot_main(int argc, char **argv);

#ifdef __cplusplus
}
#endif

#endif
