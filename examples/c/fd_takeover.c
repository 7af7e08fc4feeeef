// fd_takeover: a program that closes every descriptor it did not open, as daemons do, then
// opens a scratch file of its own at the number the shim keeps its region file at (900 and
// up), and allocates enough for the region to grow many times after that.
//
//   usage: fd_takeover SCRATCH_FILE
//
// Prints "ready PID" once the first blocks are live (the shim's descriptor is still open),
// waits for a line on stdin, takes the descriptors over, allocates 300,000 blocks of 64 B
// from take_over_and_allocate (kept live), prints "done PID 300000 19200000" and waits for
// stdin to close. Output with write(2), so stdio allocates nothing.
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BLOCKS 300000

static void *blocks[BLOCKS];

__attribute__((noinline)) static void take_over_and_allocate(const char *scratch) {
    for (int fd = 3; fd < 1024; fd++)
        close(fd);
    int s = open(scratch, O_RDWR);
    if (s < 0) {
        perror("open");
        exit(2);
    }
    for (int fd = 900; fd < 910; fd++)
        dup2(s, fd);
    close(s);
    for (int i = 0; i < BLOCKS; i++) {
        blocks[i] = malloc(64);
        memset(blocks[i], 3, 64);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: fd_takeover SCRATCH_FILE\n");
        return 2;
    }
    char msg[96];
    int n = snprintf(msg, sizeof msg, "ready %d\n", (int)getpid());
    write(1, msg, n);
    char c;
    if (read(0, &c, 1) != 1)
        return 1;
    take_over_and_allocate(argv[1]);
    n = snprintf(msg, sizeof msg, "done %d %d %d\n", (int)getpid(), BLOCKS, BLOCKS * 64);
    write(1, msg, n);
    while (read(0, &c, 1) > 0) {
    }
    for (int i = 0; i < BLOCKS; i++)
        free(blocks[i]);
    return 0;
}
