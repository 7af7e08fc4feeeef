/*
 * examples/c/py_two_callers.c — two C functions that call a Python callback, with frames of the
 * same size at the same depth (collector/tests/python.rs,
 * `stacks_differing_only_in_a_native_frame_stay_apart`): Python stacks that differ only in one
 * native frame deep below the innermost Python frame.
 *
 * Build: cc -O1 -g -fno-omit-frame-pointer -shared -fPIC -o py_two_callers py_two_callers.c
 */
typedef long (*callback)(long);

__attribute__((noinline)) long via_a(callback cb, long n) {
    long r = cb(n);
    __asm__ volatile("" ::: "memory"); /* keep the frame: no tail call */
    return r;
}

__attribute__((noinline)) long via_b(callback cb, long n) {
    long r = cb(n);
    __asm__ volatile("" ::: "memory");
    return r;
}
