//! What is pushed of a profile ([`for_push`]): `alloc_*` as deltas since the previous push of
//! the same process, and a profile past the servers' limits aggregated by stack and trimmed.

use heapdump_proto as pp;
use std::collections::HashMap;

/// Most samples in one pushed profile (Pyroscope's default `max_profile_size_samples`).
pub const MAX_SAMPLES: usize = 16_000;
/// Most bytes of one pushed profile, uncompressed (Pyroscope's default `max_profile_size_bytes`).
pub const MAX_PROFILE_BYTES: usize = 4 << 20;

/// The cumulative `alloc_objects` and `alloc_space` of each stack in the last profile pushed
/// of one process, by the [`stack_key`] of its locations' addresses (leaf first).
pub type AllocState = HashMap<u128, [i64; 2]>;

/// A 128-bit hash of a stack's addresses: two SipHash-1-3 (std's `DefaultHasher`, fixed keys)
/// of them, told apart by a first word. 16 bytes per stack instead of 8 per frame; two of 1 M
/// stacks collide with a probability of about 2^-89.
pub fn stack_key(addresses: impl Iterator<Item = u64> + Clone) -> u128 {
    use std::hash::Hasher;
    let half = |seed: u64| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        h.write_u64(seed);
        for a in addresses.clone() {
            h.write_u64(a);
        }
        h.finish() as u128
    };
    half(0x6865_6170_6475_6d70) << 64 | half(0x7075_7368_5f6b_6579)
}

/// The index of the sample type named `name` in `p`.
fn value_index(p: &pp::Profile, name: &str) -> Option<usize> {
    (p.sample_type.iter())
        .position(|t| p.string_table.get(t.r#type as usize).map(String::as_str) == Some(name))
}

/// The profile to push instead of `p`, and the state for the next push of the same process.
///
/// `alloc_*` become deltas since `prev` (the state the previous push of this process returned)
/// per stack: never negative, a stack absent from `prev` counting from 0; with no `prev` (the
/// first push) they are 0. Samples left with only zeros are dropped. Then, past
/// [`MAX_SAMPLES`] samples or [`MAX_PROFILE_BYTES`] bytes, samples are aggregated by stack
/// (labels dropped) and, if still more than [`MAX_SAMPLES`], trimmed ([`trim`]).
pub fn for_push(p: &pp::Profile, prev: Option<&AllocState>) -> (pp::Profile, AllocState) {
    use prost::Message;
    let mut p = p.clone();
    let mut state = AllocState::new();
    let address: HashMap<u64, u64> = p.location.iter().map(|l| (l.id, l.address)).collect();
    if let (Some(an), Some(ab)) = (
        value_index(&p, "alloc_objects"),
        value_index(&p, "alloc_space"),
    ) {
        let keys: Vec<u128> = (p.sample.iter())
            .map(|s| {
                stack_key((s.location_id.iter()).map(|id| address.get(id).copied().unwrap_or(0)))
            })
            .collect();
        // Cumulative values per stack, over all its samples.
        state.reserve(p.sample.len());
        for (s, &k) in p.sample.iter().zip(&keys) {
            let e = state.entry(k).or_default();
            e[0] += s.value.get(an).copied().unwrap_or(0);
            e[1] += s.value.get(ab).copied().unwrap_or(0);
        }
        // The delta goes on the stack's first sample carrying alloc_* values.
        let mut done: std::collections::HashSet<u128> = Default::default();
        for (s, &k) in p.sample.iter_mut().zip(&keys) {
            if s.value.len() <= an.max(ab) || (s.value[an] == 0 && s.value[ab] == 0) {
                continue;
            }
            let (n, b) = if done.contains(&k) {
                (0, 0)
            } else {
                let now = state[&k];
                let before = prev.map(|m| m.get(&k).copied().unwrap_or([0, 0]));
                done.insert(k);
                match before {
                    Some(b) => ((now[0] - b[0]).max(0), (now[1] - b[1]).max(0)),
                    None => (0, 0),
                }
            };
            s.value[an] = n;
            s.value[ab] = b;
        }
        p.sample.retain(|s| s.value.iter().any(|&v| v != 0));
    }
    if p.sample.len() > MAX_SAMPLES || p.encoded_len() > MAX_PROFILE_BYTES {
        aggregate(&mut p);
        if p.sample.len() > MAX_SAMPLES {
            trim(&mut p, MAX_SAMPLES);
        }
    }
    // Parca refuses a profile whose ids have gaps: pprof::build numbers them from 1, and
    // neither the deltas nor trimming leave one.
    debug_assert_eq!(super::parca::check_ids(&p), Ok(()));
    (p, state)
}

/// Merges the samples of `p` with the same locations (values summed, labels dropped), in the
/// order of their first sample. Exact (samples are sorted by their locations, not hashed),
/// and nothing is copied but the samples' indexes.
pub fn aggregate(p: &mut pp::Profile) {
    let samples = std::mem::take(&mut p.sample);
    // Indexes sorted by locations, then by index: each stack's first sample leads its run.
    let mut order: Vec<usize> = (0..samples.len()).collect();
    order.sort_unstable_by(|&a, &b| {
        (samples[a].location_id.cmp(&samples[b].location_id)).then(a.cmp(&b))
    });
    // For each sample, the first sample of its stack.
    let mut first: Vec<usize> = (0..samples.len()).collect();
    for w in order.windows(2) {
        if samples[w[0]].location_id == samples[w[1]].location_id {
            first[w[1]] = first[w[0]];
        }
    }
    let mut slot: Vec<Option<usize>> = vec![None; samples.len()];
    let mut out: Vec<pp::Sample> = Vec::new();
    for (i, s) in samples.into_iter().enumerate() {
        match slot[first[i]] {
            Some(o) => {
                let v = &mut out[o].value;
                if v.len() < s.value.len() {
                    v.resize(s.value.len(), 0);
                }
                for (a, b) in v.iter_mut().zip(&s.value) {
                    *a += b;
                }
            }
            None => {
                slot[first[i]] = Some(out.len());
                out.push(pp::Sample {
                    location_id: s.location_id,
                    value: s.value,
                    label: vec![],
                });
            }
        }
    }
    p.sample = out;
}

/// Keeps the `max - 1` largest samples of `p` by `inuse_space` (ties: by location ids, then
/// the other values, largest first) and folds the others into one sample whose only location
/// is a function named `(other: N stacks trimmed)`, with a comment saying how many samples and
/// bytes were trimmed. Nothing changes if `p` has at most `max` samples.
pub fn trim(p: &mut pp::Profile, max: usize) {
    if p.sample.len() <= max || max == 0 {
        return;
    }
    let inuse = value_index(p, "inuse_space").unwrap_or(p.sample_type.len().saturating_sub(1));
    let width = p.sample_type.len();
    let v = |s: &pp::Sample| s.value.get(inuse).copied().unwrap_or(0);
    let mut samples = std::mem::take(&mut p.sample);
    samples.sort_by(|a, b| {
        v(b).cmp(&v(a))
            .then_with(|| a.location_id.cmp(&b.location_id))
            .then_with(|| b.value.cmp(&a.value))
    });
    let dropped = samples.split_off(max - 1);
    let mut other = vec![0i64; width];
    for s in &dropped {
        for (a, b) in other.iter_mut().zip(&s.value) {
            *a += b;
        }
    }
    let name = format!("(other: {} stacks trimmed)", dropped.len());
    let mut string = |text: &str| -> i64 {
        p.string_table.push(text.to_owned());
        p.string_table.len() as i64 - 1
    };
    let name_id = string(&name);
    let comment = string(&format!(
        "pushed profile trimmed to {max} samples: {} samples ({} bytes in use) folded into {name:?}",
        dropped.len(),
        other.get(inuse).copied().unwrap_or(0)
    ));
    p.comment.push(comment);
    let fid = p.function.iter().map(|f| f.id).max().unwrap_or(0) + 1;
    p.function.push(pp::Function {
        id: fid,
        name: name_id,
        system_name: name_id,
        filename: 0,
        start_line: 0,
    });
    let lid = p.location.iter().map(|l| l.id).max().unwrap_or(0) + 1;
    p.location.push(pp::Location {
        id: lid,
        mapping_id: 0,
        address: 0,
        line: vec![pp::Line {
            function_id: fid,
            line: 0,
        }],
        is_folded: false,
    });
    samples.push(pp::Sample {
        location_id: vec![lid],
        value: other,
        label: vec![],
    });
    p.sample = samples;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A profile with Go's heap sample types and one location (its own function `f{i}`, at
    /// address `0x1000 + i`) per entry of `samples` (location indexes, values).
    fn synthetic(locations: usize, samples: &[(Vec<usize>, [i64; 4])]) -> pp::Profile {
        let mut p = pp::Profile {
            string_table: vec![String::new()],
            ..Default::default()
        };
        let string = |p: &mut pp::Profile, t: &str| {
            p.string_table.push(t.to_owned());
            p.string_table.len() as i64 - 1
        };
        for (t, u) in [
            ("alloc_objects", "count"),
            ("alloc_space", "bytes"),
            ("inuse_objects", "count"),
            ("inuse_space", "bytes"),
        ] {
            let (t, u) = (string(&mut p, t), string(&mut p, u));
            p.sample_type.push(pp::ValueType { r#type: t, unit: u });
        }
        let key = string(&mut p, "bytes");
        for i in 0..locations {
            let name = string(&mut p, &format!("f{i}"));
            p.function.push(pp::Function {
                id: i as u64 + 1,
                name,
                system_name: name,
                filename: 0,
                start_line: 0,
            });
            p.location.push(pp::Location {
                id: i as u64 + 1,
                mapping_id: 0,
                address: 0x1000 + i as u64,
                line: vec![pp::Line {
                    function_id: i as u64 + 1,
                    line: 0,
                }],
                is_folded: false,
            });
        }
        for (locs, v) in samples {
            p.sample.push(pp::Sample {
                location_id: locs.iter().map(|&l| l as u64 + 1).collect(),
                value: v.to_vec(),
                label: vec![pp::Label {
                    key,
                    num: v[3],
                    ..Default::default()
                }],
            });
        }
        p
    }

    #[test]
    fn a_profile_of_20000_stacks_is_trimmed_to_16000_samples() {
        // Sample i: inuse_space i/2 + 1 (pairs tie), alloc twice that.
        let samples: Vec<(Vec<usize>, [i64; 4])> = (0..20_000)
            .map(|i| {
                let b = i as i64 / 2 + 1;
                (vec![i], [1, 2 * b, 1, b])
            })
            .collect();
        let p = synthetic(20_000, &samples);
        let (q, state) = for_push(&p, None);
        assert_eq!(state.len(), 20_000);
        assert_eq!(q.sample.len(), 16_000);
        assert_eq!(q.sample.len(), MAX_SAMPLES);
        // Kept: inuse_space 10000 down to 2002 (both of each pair), and of the pair at 2001
        // the one with the lower location id (sample 4000, location 4001).
        let kept: std::collections::HashSet<u64> = (q.sample[..15_999].iter())
            .map(|s| s.location_id[0])
            .collect();
        assert!(kept.contains(&4001) && !kept.contains(&4002));
        assert!((4003..=20_000).all(|l| kept.contains(&l)));
        assert!((1..=4000).all(|l| !kept.contains(&l)));
        assert_eq!(q.sample[0].value, [0, 0, 1, 10_000], "largest first");
        assert!(q.sample.iter().all(|s| s.label.is_empty()));
        // Dropped: samples 0..4000 (1..=2000, twice) and 4001 (2001): 4001 samples.
        let trimmed = 2 * (2000 * 2001 / 2) + 2001;
        assert_eq!(trimmed, 4_004_001);
        let other = &q.sample[15_999];
        assert_eq!(other.value, [0, 0, 4001, trimmed], "first push: alloc_* 0");
        let total_in = (samples.iter()).map(|s| s.1[3]).sum::<i64>();
        let total_out = q.sample.iter().map(|s| s.value[3]).sum::<i64>();
        assert_eq!(total_in, total_out);
        // The "other" location and function: ids next in sequence, named in the string table.
        assert_eq!(other.location_id, [20_001]);
        let loc = q.location.last().unwrap();
        assert_eq!((loc.id, loc.line.len()), (20_001, 1));
        assert_eq!(loc.line[0].function_id, 20_001);
        let f = q.function.last().unwrap();
        assert_eq!(f.id, 20_001);
        assert_eq!(
            q.string_table[f.name as usize],
            "(other: 4001 stacks trimmed)"
        );
        for (i, l) in q.location.iter().enumerate() {
            assert_eq!(l.id, i as u64 + 1);
        }
        for (i, f) in q.function.iter().enumerate() {
            assert_eq!(f.id, i as u64 + 1);
        }
        assert_eq!(
            crate::push::parca::check_ids(&q),
            Ok(()),
            "what Parca validates"
        );
        let comments: Vec<&str> = (q.comment.iter())
            .map(|&c| q.string_table[c as usize].as_str())
            .collect();
        assert_eq!(
            comments,
            [
                "pushed profile trimmed to 16000 samples: 4001 samples (4004001 bytes in use) \
              folded into \"(other: 4001 stacks trimmed)\""
            ]
        );
        // A profile within the limits is left as it is (but for the first push's alloc_*).
        let small = synthetic(3, &samples[..3]);
        let (q, _) = for_push(&small, None);
        assert_eq!(q.sample.len(), 3);
        assert!(q.sample.iter().all(|s| s.label.len() == 1));
    }

    #[test]
    fn alloc_values_are_deltas_per_stack_since_the_previous_push() {
        // Stack [0, 1] in two samples (sizes), the alloc_* on the first; stack [1]; stack [2]
        // freed entirely (alloc only).
        let first = synthetic(
            4,
            &[
                (vec![0, 1], [10, 1000, 3, 300]),
                (vec![0, 1], [0, 0, 1, 50]),
                (vec![1], [5, 500, 5, 500]),
                (vec![2], [7, 70, 0, 0]),
            ],
        );
        let (q, s1) = for_push(&first, None);
        let values: Vec<&[i64]> = q.sample.iter().map(|s| s.value.as_slice()).collect();
        // First push: alloc_* 0; the alloc-only sample of stack [2] is then empty and dropped.
        assert_eq!(
            values,
            [&[0, 0, 3, 300][..], &[0, 0, 1, 50], &[0, 0, 5, 500]]
        );
        assert_eq!(s1[&stack_key([0x1000, 0x1001].into_iter())], [10, 1000]);
        // Second: [0, 1] grew by 4 / 400, [1] did not, [2] absent, [3] new (counts from 0);
        // a counter that went down gives 0, never a negative value.
        let second = synthetic(
            4,
            &[
                (vec![0, 1], [14, 1400, 4, 400]),
                (vec![1], [5, 500, 5, 500]),
                (vec![3], [2, 64, 2, 64]),
            ],
        );
        let (q, s2) = for_push(&second, Some(&s1));
        let values: Vec<&[i64]> = q.sample.iter().map(|s| s.value.as_slice()).collect();
        assert_eq!(
            values,
            [&[4, 400, 4, 400][..], &[0, 0, 5, 500], &[2, 64, 2, 64]]
        );
        let third = synthetic(4, &[(vec![0, 1], [12, 1200, 1, 100])]);
        let (q, _) = for_push(&third, Some(&s2));
        assert_eq!(q.sample[0].value, [0, 0, 1, 100]);
    }

    #[test]
    fn aggregate_merges_samples_of_one_stack() {
        let mut p = synthetic(
            2,
            &[
                (vec![0, 1], [1, 10, 1, 10]),
                (vec![1], [2, 20, 2, 20]),
                (vec![0, 1], [3, 30, 0, 0]),
            ],
        );
        aggregate(&mut p);
        let got: Vec<(&[u64], &[i64], usize)> = (p.sample.iter())
            .map(|s| (s.location_id.as_slice(), s.value.as_slice(), s.label.len()))
            .collect();
        assert_eq!(
            got,
            [
                (&[1, 2][..], &[4, 40, 1, 10][..], 0),
                (&[2], &[2, 20, 2, 20], 0)
            ]
        );
    }
}
