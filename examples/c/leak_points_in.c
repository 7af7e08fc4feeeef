// leak_points_in: a leaked block (make_lost: 64 B, nothing points to it) holding a pointer to a
// block a global owns (g_owner -> make_owner: 16 B -> make_big: 100,000 B). Prints "ready PID"
// and waits for stdin to close.
// Expected: g_owner and make_owner retain 100,016 B (the leak keeps nothing alive); leaks
// finds the 64 B block.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
void **g_owner;
__attribute__((noinline)) void *make_big(void){ void*p=malloc(100000); memset(p,'a',100000); return p; }
__attribute__((noinline)) void **make_owner(void){ return malloc(16); }
__attribute__((noinline)) void make_lost(void *p){ void **l=malloc(64); memset(l,0,64); l[0]=p; __asm__ volatile(""::"r"(l):"memory"); }
int main(){
  g_owner=make_owner(); g_owner[0]=make_big(); g_owner[1]=0;
  make_lost(g_owner[0]);
  { volatile char buf[8192]; memset((char*)buf,0,sizeof buf); }
  printf("ready %d\n",getpid()); fflush(stdout);
  char c; while(read(0,&c,1)>0){}
}
