// net/transport_tcp_none.c — the tcp transport and the relay in a build without OpenSSL's
// libcrypto (net/net.mk picks this file instead of net/transport_tcp.c and net/relay.c): both say what
// to install, on one line.
#include "llmc/common.h"
#include "net/relay.h"
#include "net/transport.h"

#define INSTALL_HINT "install OpenSSL's libcrypto (Debian/Ubuntu: libssl-dev, RHEL: openssl-devel) and rebuild"

void transport_tcp_check_built(void) {
    fail("diloco_transport = tcp: this train_gpt was built without OpenSSL, which authenticates the replicas: "
         INSTALL_HINT);
}

bool transport_tcp_built(void) { return false; }

void transport_tcp_check_rendezvous(const char *list, bool serve) { (void)list, (void)serve; }

transport *transport_tcp_open(const transport_options *o) {
    (void)o;
    transport_tcp_check_built();
    return NULL;
}

int relay_main(int argc, char **argv) {
    (void)argc, (void)argv;
    fail("train_gpt relay: this train_gpt was built without OpenSSL: " INSTALL_HINT);
}
