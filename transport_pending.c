// transport_pending.c — TEMPORARY while the tcp transport and quant.c are being written in
// parallel: keeps the build linking. diloco.mk compiles it only when those files are missing.
#include "transport.h"
#include "common.h"
#ifdef PENDING_TCP
transport *transport_tcp_open(const transport_options *o) { (void)o; fail("tcp transport not built yet"); }
#endif
