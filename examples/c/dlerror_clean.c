/* dlerror() at the start of main returns NULL: nothing the shim did at load time (looking for
 * CPython's symbols with dlsym) shows through. Exits 0 when clean, 1 with the message. */
#include <dlfcn.h>
#include <stdio.h>

int main(void) {
    const char *e = dlerror();
    if (e) {
        printf("dlerror: %s\n", e);
        return 1;
    }
    printf("clean\n");
    return 0;
}
