// Loads .heapsnapshot files with Chrome DevTools' own parser (the npm package
// heap-snapshot-toolkit, which bundles devtools-frontend's HeapSnapshot code) and prints, for
// each file, one JSON line with what DevTools computed: node and edge counts, and per node (in
// node order) its id, self size, retained size and immediate dominator (a node ordinal), plus
// the Summary view's groups (class name → count and self size) and getStatistics().
//
// Usage: node check.mjs TOOLKIT_DIR FILE...   (TOOLKIT_DIR: the directory holding
// node_modules/heap-snapshot-toolkit, e.g. from `npm install --prefix TOOLKIT_DIR ...`).
import { createReadStream } from 'node:fs'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'

const [toolkitDir, ...files] = process.argv.slice(2)
const toolkit = join(toolkitDir, 'node_modules', 'heap-snapshot-toolkit', 'index.js')
const { parse } = await import(pathToFileURL(toolkit).href)

for (const file of files) {
  const snapshot = await parse(createReadStream(file, 'utf-8'))
  const fields = snapshot.nodeFieldCount
  const ids = []
  const selfSizes = []
  const retained = []
  const dominator = []
  for (let i = 0; i < snapshot.nodeCount; i++) {
    const node = snapshot.createNode(i * fields)
    ids.push(node.id())
    selfSizes.push(node.selfSize())
    retained.push(node.retainedSize())
    dominator.push(snapshot.dominatorsTree[i])
  }
  const summary = {}
  for (const a of Object.values(snapshot.aggregatesWithFilter({}))) {
    summary[a.name] = { count: a.count, self: a.self }
  }
  console.log(JSON.stringify({
    file,
    node_count: snapshot.nodeCount,
    edge_count: snapshot.containmentEdges.length / snapshot.edgeFieldsCount,
    ids,
    self_sizes: selfSizes,
    retained,
    dominator,
    summary,
    statistics: snapshot.getStatistics()
  }))
}
