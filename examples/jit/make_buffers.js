// Node.js program for the JIT tests (collector/tests/jit.rs): 2,000 Buffers of 20,000 to
// 20,006 bytes (40,006,000 bytes, outside V8's heap, allocated with malloc) made in the named
// function makeBuffers and held. Prints "ready PID", then exits when stdin closes.
function makeBuffers(n) {
  const out = [];
  for (let i = 0; i < n; i++) out.push(Buffer.alloc(20000 + (i % 7)));
  return out;
}
const held = makeBuffers(2000);
console.log("ready", process.pid);
process.stdin.resume();
process.stdin.on("end", () => {
  // Keep the Buffers live up to exit (for a post-mortem snapshot).
  process.exitCode = held.length === 2000 ? 0 : 1;
  process.exit();
});
