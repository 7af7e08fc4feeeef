// leaky_lib: a library leaky.c dlopens; keeps a block in its global lib_kept.
#include <stdlib.h>

void *lib_kept;

void lib_keep(void *p) { lib_kept = p; }
