//! The sampling formula, shared by the shim (which samples) and the collector (which unbiases).
//!
//! In sampling mode the shim treats allocated bytes as a Poisson process of mean interval `I`
//! bytes (heapprofd, jemalloc, tcmalloc; Go's `scaleHeapSample`): each thread counts down an
//! exponentially distributed distance ([`next_distance`]) and records the block whose bytes
//! cross zero. A block of `S` bytes is then recorded with probability
//! [`probability`]` = 1 - exp(-S / I)`, and one recorded block stands for
//! [`weight`]` = 1 / probability` blocks of its size. Pure arithmetic: callable inside `malloc`.

/// The probability (in `[0, 1]`) that a block of `size` bytes is recorded when bytes are
/// sampled at a mean `interval` bytes; 1 when `interval` is 0 (every block recorded) and 0 for
/// an empty block.
pub fn probability(size: f64, interval: u64) -> f64 {
    if interval == 0 {
        return 1.0;
    }
    if size <= 0.0 {
        return 0.0;
    }
    1.0 - (-size / interval as f64).exp()
}

/// How many blocks of `size` bytes one recorded block stands for at a mean sampling `interval`
/// (bytes): `1 / probability(size, interval)`. 1 when `interval` is 0 (every block recorded)
/// or `size` is not positive.
pub fn weight(size: f64, interval: u64) -> f64 {
    if interval == 0 || size <= 0.0 {
        return 1.0;
    }
    1.0 / probability(size, interval)
}

/// The distance in bytes (at least 1) to the next sampled byte, exponentially distributed with
/// mean `interval`: the inverse of the exponential distribution's CDF at `u`, a uniform draw in
/// `(0, 1)`. Capped at 2^61 so that a countdown never overflows.
pub fn next_distance(u: f64, interval: u64) -> i64 {
    ((-u.ln() * interval as f64).min(i64::MAX as f64 / 4.0) as i64).max(1)
}

/// One step of a thread's countdown: `left` bytes remained before the next sampled byte, and a
/// block of `size` bytes is allocated. Returns the bytes left after it: zero or less when the
/// block is sampled (then the caller draws a fresh distance with [`next_distance`]).
#[inline]
pub fn count_down(left: i64, size: u64) -> i64 {
    left - size.min(i64::MAX as u64 / 2) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_block_without_sampling() {
        assert_eq!(probability(100.0, 0), 1.0);
        assert_eq!(weight(100.0, 0), 1.0);
        assert_eq!(weight(0.0, 4096), 1.0);
        assert_eq!(probability(0.0, 4096), 0.0);
    }

    #[test]
    fn weight_is_the_inverse_probability() {
        // A block of the interval's size: 1 - 1/e.
        let p = probability(4096.0, 4096);
        assert!((p - (1.0 - (-1.0f64).exp())).abs() < 1e-12);
        assert!((weight(4096.0, 4096) * p - 1.0).abs() < 1e-12);
        // Small blocks weigh about interval / size; huge ones 1.
        assert!((weight(16.0, 1 << 20) - (1 << 20) as f64 / 16.0).abs() < 1.0);
        assert_eq!(weight(1e12, 4096), 1.0);
    }

    #[test]
    fn distance_is_exponential() {
        assert_eq!(next_distance(1.0, 4096), 1);
        assert!((4095..=4096).contains(&next_distance((-1.0f64).exp(), 4096)));
        assert_eq!(next_distance(f64::MIN_POSITIVE, u64::MAX), 1 << 61);
    }

    /// The countdown with exponential distances records a block of SIZE with the probability
    /// the collector unbiases by: measured over 200,000 blocks from a fixed seed.
    #[test]
    fn countdown_samples_at_the_formula_rate() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut uniform = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        for (size, interval) in [(512u64, 4096u64), (4096, 4096), (64, 1024)] {
            let n = 200_000;
            let mut left = next_distance(uniform(), interval);
            let mut sampled = 0u32;
            for _ in 0..n {
                left = count_down(left, size);
                if left <= 0 {
                    sampled += 1;
                    left = next_distance(uniform(), interval);
                }
            }
            let p = probability(size as f64, interval);
            let rate = sampled as f64 / n as f64;
            // Binomial standard deviation at n = 200,000 is below 0.0012; 5 sigma.
            assert!(
                (rate - p).abs() < 0.006,
                "size {size}, interval {interval}: rate {rate}, formula {p}"
            );
        }
    }
}
