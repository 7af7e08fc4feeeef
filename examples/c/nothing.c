// nothing: allocates nothing and exits 0 (a wrapper's helper, as far as heapdump can tell).
int main(void) { return 0; }
