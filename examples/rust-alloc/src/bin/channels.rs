//! A multi-threaded Rust program (std threads and channels) with deterministic output, run
//! under `LD_PRELOAD=libheapdump.so` by the tests to check the shim changes nothing.
use std::sync::mpsc;
use std::thread;

fn main() {
    let (tx, rx) = mpsc::channel::<Vec<u64>>();
    let workers: Vec<_> = (0..4u64)
        .map(|w| {
            let tx = tx.clone();
            thread::spawn(move || {
                for i in 0..2000u64 {
                    let v: Vec<u64> = (0..(i % 64)).map(|k| k * w + i).collect();
                    tx.send(v).unwrap();
                }
            })
        })
        .collect();
    drop(tx);
    let mut total = 0u64;
    let mut strings = Vec::new();
    for v in rx {
        total = total.wrapping_add(v.iter().sum::<u64>());
        if v.len() == 63 {
            strings.push(format!("{}", v[0]));
        }
    }
    for w in workers {
        w.join().unwrap();
    }
    strings.sort();
    println!("total {total} strings {}", strings.len());
}
