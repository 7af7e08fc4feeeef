//! Symbolization of return addresses with blazesym, from the module table the region recorded
//! (so it works after the process is gone, as long as the files are still on disk).

use std::collections::HashMap;
use std::path::Path;
use vmo_layout::Module;

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};

/// One source-level frame; a return address can expand to several (inlining).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Function name (demangled).
    pub function: String,
    /// Source file, empty when unknown.
    pub file: String,
    /// Line, 0 when unknown.
    pub line: u32,
}

/// What is known of one address.
#[derive(Debug, Clone, Default)]
pub struct Resolved {
    /// Index into the module list, if the address lies in a module.
    pub module: Option<usize>,
    /// Frames, innermost (inlined) first; empty when not symbolized.
    pub frames: Vec<Frame>,
}

/// Index of the module whose PT_LOAD segments contain `addr`.
pub fn module_of(modules: &[Module], addr: u64) -> Option<usize> {
    modules.iter().position(|m| {
        m.segments.iter().any(|s| {
            let start = m.base.wrapping_add(s.vaddr);
            addr >= start && addr < start.wrapping_add(s.memsz)
        })
    })
}

/// Symbolizes `addrs` (call-site addresses: return address − 1) against `modules`.
///
/// Modules whose file no longer exists, or whose build ID differs from the recorded one, are left
/// unsymbolized (their mapping keeps the build ID so pprof can symbolize later).
pub fn symbolize(modules: &[Module], addrs: &[u64]) -> HashMap<u64, Resolved> {
    let mut by_module: HashMap<usize, Vec<u64>> = HashMap::new();
    let mut out: HashMap<u64, Resolved> = HashMap::with_capacity(addrs.len());
    for &a in addrs {
        let m = module_of(modules, a);
        out.insert(
            a,
            Resolved {
                module: m,
                frames: Vec::new(),
            },
        );
        if let Some(m) = m {
            by_module.entry(m).or_default().push(a);
        }
    }
    let symbolizer = Symbolizer::builder()
        .enable_code_info(true)
        .enable_inlined_fns(true)
        .enable_demangling(true)
        .build();
    for (m, list) in by_module {
        let module = &modules[m];
        let path = Path::new(&module.path);
        if !path.is_absolute() || !path.exists() || !build_id_matches(path, &module.build_id) {
            continue;
        }
        let src = Source::Elf(Elf::new(path));
        let virt: Vec<u64> = list.iter().map(|a| a.wrapping_sub(module.base)).collect();
        let Ok(syms) = symbolizer.symbolize(&src, Input::VirtOffset(&virt)) else {
            continue;
        };
        for (a, s) in list.iter().zip(syms) {
            let Symbolized::Sym(sym) = s else { continue };
            let mut frames = Vec::with_capacity(1 + sym.inlined.len());
            // pprof wants innermost first; blazesym reports the outer function, then inlined
            // calls outermost to innermost, each with the location inside it.
            let mut loc = sym.code_info.as_deref().map(code_loc).unwrap_or_default();
            let mut chain = vec![(sym.name.to_string(), std::mem::take(&mut loc))];
            for f in sym.inlined.iter() {
                chain.push((
                    f.name.to_string(),
                    f.code_info.as_ref().map(code_loc).unwrap_or_default(),
                ));
            }
            for (name, (file, line)) in chain.into_iter().rev() {
                frames.push(Frame {
                    function: name,
                    file,
                    line,
                });
            }
            if let Some(r) = out.get_mut(a) {
                r.frames = frames;
            }
        }
    }
    out
}

fn code_loc(c: &blazesym::symbolize::CodeInfo<'_>) -> (String, u32) {
    (
        c.to_path().to_string_lossy().into_owned(),
        c.line.unwrap_or(0),
    )
}

/// Whether the ELF file at `path` carries `expected` as its GNU build ID (true when none was
/// recorded or the file cannot be read as ELF: blazesym will then decide).
fn build_id_matches(path: &Path, expected: &[u8]) -> bool {
    if expected.is_empty() {
        return true;
    }
    match blazesym::helper::read_elf_build_id(path) {
        Ok(Some(id)) => id.as_ref() == expected,
        _ => true,
    }
}
