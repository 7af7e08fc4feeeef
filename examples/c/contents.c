// contents: holds blocks with known contents, for `heapdump snapshot --contents-dir` and
// `--with-strings` (collector/tests/contents.rs regenerates every byte from these rules).
//
//   text0..text2  malloc(32):   "hello heapdump N" (N = 0, 1, 2), then zeros
//   long          malloc(200):  'a' + (j % 26) for j < 199, then one zero byte
//   utf8          malloc(24):   "h\xc3\xa9llo w\xc3\xb6rld" ("héllo wörld", 13 bytes), then zeros
//   short         malloc(16):   "abc", then zeros (3 printable bytes: too short for a label)
//   big           malloc(102400): byte j = (j * 7 + 3) % 251
//   huge          malloc(1 MiB) (an mmap chunk of its own): byte j = (j * 13 + 5) % 253
//   binK (K < 10) malloc(48):   byte j = (K * 31 + j * 17 + 1) & 0xff, byte 0 = 0x01
//
// Prints "block NAME 0xADDRESS SIZE" for each (with write(2): stdio allocates nothing), then
// "ready PID". On the stdin line "free", frees bin0..bin4 and huge and prints "freed"; exits
// when stdin closes.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void say(const char *name, void *p, size_t size) {
    char msg[128];
    int n = snprintf(msg, sizeof msg, "block %s %p %zu\n", name, p, size);
    write(1, msg, n);
}

static void *text[3], *longtext, *utf8, *shorttext, *big, *huge, *bin[10];

__attribute__((noinline)) static void make_blocks(void) {
    for (int i = 0; i < 3; i++) {
        text[i] = malloc(32);
        memset(text[i], 0, 32);
        snprintf(text[i], 32, "hello heapdump %d", i);
    }
    longtext = malloc(200);
    for (int j = 0; j < 199; j++) ((char *)longtext)[j] = 'a' + j % 26;
    ((char *)longtext)[199] = 0;
    utf8 = malloc(24);
    memset(utf8, 0, 24);
    memcpy(utf8, "h\xc3\xa9llo w\xc3\xb6rld", 13);
    shorttext = malloc(16);
    memset(shorttext, 0, 16);
    memcpy(shorttext, "abc", 3);
    big = malloc(102400);
    for (int j = 0; j < 102400; j++) ((unsigned char *)big)[j] = (j * 7 + 3) % 251;
    huge = malloc(1 << 20);
    for (int j = 0; j < 1 << 20; j++) ((unsigned char *)huge)[j] = (j * 13 + 5) % 253;
    for (int k = 0; k < 10; k++) {
        bin[k] = malloc(48);
        for (int j = 0; j < 48; j++) ((unsigned char *)bin[k])[j] = (k * 31 + j * 17 + 1) & 0xff;
        ((unsigned char *)bin[k])[0] = 1;
    }
}

int main(void) {
    make_blocks();
    char name[16];
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "text%d", i);
        say(name, text[i], 32);
    }
    say("long", longtext, 200);
    say("utf8", utf8, 24);
    say("short", shorttext, 16);
    say("big", big, 102400);
    say("huge", huge, 1 << 20);
    for (int k = 0; k < 10; k++) {
        snprintf(name, sizeof name, "bin%d", k);
        say(name, bin[k], 48);
    }
    char msg[64];
    int n = snprintf(msg, sizeof msg, "ready %d\n", (int)getpid());
    write(1, msg, n);
    char line[64];
    size_t have = 0;
    ssize_t r;
    while ((r = read(0, line + have, sizeof line - 1 - have)) > 0) {
        have += r;
        line[have] = 0;
        if (strstr(line, "free\n")) {
            for (int k = 0; k < 5; k++) free(bin[k]);
            free(huge);
            write(1, "freed\n", 6);
            have = 0;
        } else if (have == sizeof line - 1) {
            have = 0;
        }
    }
    return 0;
}
