// bench/diloco/relay_flood/flood.c — a connect flood without the secret: non-blocking connects
// to 127.0.0.1:PORT for SECONDS, up to 512 in flight, each reset (SO_LINGER 0) when its slot is
// reused. Prints how many it made. Usage: flood PORT SECONDS
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: flood PORT SECONDS\n");
        return 2;
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(argv[1]))};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    double end = now_s() + atof(argv[2]);
    int slots[512] = {0};
    long made = 0;
    while (now_s() < end) {
        int *slot = &slots[made % 512];
        if (*slot > 0) close(*slot);
        int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        struct linger reset = {1, 0};
        setsockopt(s, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
        (void)connect(s, (struct sockaddr *)&a, sizeof a);
        *slot = s;
        made++;
    }
    printf("flood: %ld connects\n", made);
    return 0;
}
