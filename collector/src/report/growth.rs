//! Growth ranking: how steadily an allocation site's live bytes grow over a series of
//! snapshots.
//!
//! A leak grows at every interval, along a line; a cache fills once and stays flat; a burst
//! comes and goes. Each series gets: the least-squares slope (bytes per second), its
//! coefficient of determination R² (how well a line fits: 1 for a straight line, near 0 for
//! noise or a flat series), the Theil–Sen slope (the median of the slopes between every two
//! snapshots: robust, so one big step or a burst caught by a few snapshots does not make it
//! large, Sen 1968), and the fraction of intervals over which the value grew. The ranking
//! score is `max(Theil–Sen slope, 0) × R² ×` how evenly the growth is spread over the
//! intervals ([`spread`]): a steady leak scores its slope, a flat cache 0, a 1 MiB burst caught by the
//! last two snapshots of eight 0 (its least-squares slope would have outranked a 10 KiB/s
//! leak), and a one-off step in the middle of the window — whose Theil–Sen slope is the step's,
//! as most pairs of snapshots span it — about 0: growth that all comes from one interval is a
//! step, not a trend (helper A's warm-up of 5 MB ranked above a 10 KiB/s leak).

/// How one series grows.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Growth {
    /// Least-squares slope, value units per time unit (bytes per second in the report).
    pub slope: f64,
    /// Coefficient of determination of the least-squares line, in `[0, 1]`; 0 when the values
    /// do not vary (a flat series has no trend to fit) or there are fewer than 2 points.
    pub r2: f64,
    /// Theil–Sen slope: the median of the slopes between every two points (of at most
    /// [`MAX_PAIRS_POINTS`] points, evenly spread, for a long series).
    pub median_slope: f64,
    /// Fraction of the intervals (consecutive pairs) over which the value grew, in `[0, 1]`.
    pub grew: f64,
    /// `max(median_slope, 0) × r2 × spread` ([`spread`]: 1 for growth spread evenly over the
    /// intervals, 0 for one step): the ranking key, largest first.
    pub score: f64,
    /// The time the scored stretch of the series starts at: its first point, unless a recent
    /// stretch scored higher (see [`growth`]); then `slope`, `r2`, `median_slope`, `grew` and
    /// `score` are that stretch's.
    pub since: f64,
}

/// How much better than the whole series a recent stretch must score to stand for it (see
/// [`growth`]): by noise alone a steady leak's last stretch scores a little higher about half
/// the time, and was shown as begun a few seconds ago (helper R, 3: "since 141 s" in a watch of
/// 149 s, for a leak as old as the program).
pub const RECENT_MARGIN: f64 = 1.25;

/// Fewest points a recent stretch of a series is scored over (see [`growth`]): four
/// intervals, so that [`spread`] can tell a step from a trend there too.
pub const RECENT_MIN_POINTS: usize = 5;

/// The most points the Theil–Sen slope pairs up (a longer series is thinned evenly): its
/// cost grows as the square of the points.
pub const MAX_PAIRS_POINTS: usize = 48;

/// The median of the slopes between every two points of (`t`, `v`) with distinct times.
fn theil_sen(t: &[f64], v: &[f64]) -> f64 {
    let n = t.len();
    let idx: Vec<usize> = if n > MAX_PAIRS_POINTS {
        (0..MAX_PAIRS_POINTS)
            .map(|k| k * (n - 1) / (MAX_PAIRS_POINTS - 1))
            .collect()
    } else {
        (0..n).collect()
    };
    let mut slopes = Vec::with_capacity(idx.len() * idx.len() / 2);
    for (a, &i) in idx.iter().enumerate() {
        for &j in &idx[a + 1..] {
            let dt = t[j] - t[i];
            if dt > 0.0 {
                slopes.push((v[j] - v[i]) / dt);
            }
        }
    }
    if slopes.is_empty() {
        return 0.0;
    }
    let m = slopes.len();
    let (below, &mut upper, _) = slopes.select_nth_unstable_by(m / 2, f64::total_cmp);
    if m % 2 == 1 {
        upper
    } else {
        // The lower middle: the largest of those below.
        let lower = below.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (lower + upper) / 2.0
    }
}

/// The growth of the series `v` sampled at times `t` (same length; `t` increasing). Fewer
/// than two points, or all at one time, give zeros.
///
/// The whole series is scored, and so are its recent stretches — its last half, last quarter,
/// … (while they hold [`RECENT_MIN_POINTS`]) — that end above every earlier value; a stretch
/// stands for the series when it scores [`RECENT_MARGIN`] times the best before it. A leak that began late is flat for most of the window, so most pairs of
/// snapshots do not span it and its Theil–Sen slope over the whole window is 0 once it covers
/// less than 1 − 1/√2 (29%) of it (helper I: a 19.5 KiB/s leak begun in the last 27% scored
/// 0, below a one-off warm-up); over the stretch where it grows it scores its slope. A
/// recurring cache whose recent rise stays below its earlier peaks gains nothing: a new high
/// is required.
pub fn growth(t: &[f64], v: &[f64]) -> Growth {
    let n = t.len().min(v.len());
    let (t, v) = (&t[..n], &v[..n]);
    let mut best = growth_over(t, v);
    let mut k = n / 2;
    while k >= RECENT_MIN_POINTS {
        let start = n - k;
        let earlier = v[..start].iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if v[n - 1] > earlier {
            let g = growth_over(&t[start..], &v[start..]);
            if g.score > best.score * RECENT_MARGIN {
                best = g;
            }
        }
        k /= 2;
    }
    best
}

/// [`growth`] over the whole of `t`, `v` (same length).
fn growth_over(t: &[f64], v: &[f64]) -> Growth {
    let g = line(t, v);
    // Only a series that rises along a line can score: no pairs to sort for the others.
    let median_slope = if g.slope > 0.0 && g.r2 > 0.0 {
        theil_sen(&t[..t.len().min(v.len())], v)
    } else {
        0.0
    };
    Growth {
        median_slope,
        score: median_slope.max(0.0) * g.r2 * spread(v) * still_growing(v),
        ..g
    }
}

/// Whether `v` still grows in the second half of its intervals, in `[0, 1]`: twice the share
/// of its rises found there, at most 1 — a steady leak has about half of them there (1), one
/// that began late all (1), a cache filled in the first intervals and flat since none (0).
/// 1 with fewer than 4 intervals. Helper V, 3: a cache that filled in 5 of 12 intervals and
/// then stayed flat ranked above two leaks rising along a line through the whole window
/// (its largest single rise was a small share of the fill, so [`spread`] kept it).
fn still_growing(v: &[f64]) -> f64 {
    let k = v.len().saturating_sub(1);
    if k < 4 {
        return 1.0;
    }
    let rises: Vec<f64> = v.windows(2).map(|w| (w[1] - w[0]).max(0.0)).collect();
    let total: f64 = rises.iter().sum();
    if total <= 0.0 {
        return 0.0;
    }
    let late: f64 = rises[k / 2..].iter().sum();
    (2.0 * late / total).clamp(0.0, 1.0)
}

/// How evenly the growth of `v` is spread over its intervals, in `[0, 1]`: 1 when no interval
/// rises by more than an equal share would (a steady leak), 0 when one interval holds all of
/// it (a one-off step). `(1 − largest / total) / (1 − 1 / intervals)` of the rises; 1 with
/// fewer than 3 intervals (two or three snapshots cannot tell a step from a trend).
fn spread(v: &[f64]) -> f64 {
    let k = v.len().saturating_sub(1);
    if k < 3 {
        return 1.0;
    }
    let rises = v.windows(2).map(|w| (w[1] - w[0]).max(0.0));
    let (largest, total) = rises.fold((0.0f64, 0.0f64), |(l, s), d| (l.max(d), s + d));
    if total <= 0.0 {
        return 0.0;
    }
    ((1.0 - largest / total) / (1.0 - 1.0 / k as f64)).clamp(0.0, 1.0)
}

/// The cheap part of [`growth`] (O(n)): the least-squares slope, R² and the share of growing
/// intervals; `median_slope` and `score` are 0. What picks the candidates [`growth`] then
/// ranks, when there are many series.
pub fn line(t: &[f64], v: &[f64]) -> Growth {
    let n = t.len().min(v.len());
    if n < 2 {
        return Growth::default();
    }
    let (t, v) = (&t[..n], &v[..n]);
    let mt = t.iter().sum::<f64>() / n as f64;
    let mv = v.iter().sum::<f64>() / n as f64;
    let (mut stt, mut svv, mut stv) = (0.0, 0.0, 0.0);
    for (x, y) in t.iter().zip(v) {
        let (dx, dy) = (x - mt, y - mv);
        stt += dx * dx;
        svv += dy * dy;
        stv += dx * dy;
    }
    if stt <= 0.0 {
        return Growth::default();
    }
    let slope = stv / stt;
    let r2 = if svv > 0.0 {
        ((stv * stv) / (stt * svv)).clamp(0.0, 1.0)
    } else {
        0.0
    };
    let grew = v.windows(2).filter(|w| w[1] > w[0]).count() as f64 / (n - 1) as f64;
    Growth {
        slope,
        r2,
        median_slope: 0.0,
        grew,
        score: 0.0,
        since: t[0],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Helper V, 3's series: a cache filled over the first 5 of 12 intervals, flat since,
    /// scores far below two steady leaks of a few hundred bytes a second.
    #[test]
    fn a_cache_filled_early_ranks_below_steady_leaks() {
        let t: Vec<f64> = (0..13).map(|i| 5.0 * i as f64).collect();
        let cache = [
            203692.0, 341092.0, 478468.0, 627940.0, 769780.0, 798192.0, 798224.0, 798224.0,
            798224.0, 798224.0, 798224.0, 798307.0, 798397.0,
        ];
        let leak = |rate: f64| -> Vec<f64> {
            (0..13)
                .map(|i| 50_000.0 + rate * 5.0 * i as f64 + (i % 3) as f64 * 7.0)
                .collect()
        };
        let c = growth(&t, &cache);
        for rate in [146.0, 799.0] {
            let l = growth(&t, &leak(rate));
            assert!(
                l.score > 10.0 * c.score.max(1.0),
                "leak {l:?} against cache {c:?}"
            );
        }
    }

    fn secs(n: usize) -> Vec<f64> {
        (0..n).map(|i| i as f64).collect()
    }

    #[test]
    fn a_steady_leak_fits_a_line() {
        let v: Vec<f64> = (0..8).map(|i| 1000.0 + 640.0 * i as f64).collect();
        let g = growth(&secs(8), &v);
        assert!((g.slope - 640.0).abs() < 1e-9, "{g:?}");
        assert!((g.r2 - 1.0).abs() < 1e-12, "{g:?}");
        assert_eq!(g.grew, 1.0);
        assert!((g.median_slope - 640.0).abs() < 1e-9, "{g:?}");
        assert!((g.score - 640.0).abs() < 1e-9);
        // A long series is thinned for Theil–Sen, with the same result on a line.
        let t: Vec<f64> = (0..1000).map(|i| i as f64).collect();
        let v: Vec<f64> = t.iter().map(|s| 3.0 * s).collect();
        assert!((growth(&t, &v).median_slope - 3.0).abs() < 1e-9);
    }

    #[test]
    fn a_flat_cache_and_a_burst_rank_below_a_slow_leak() {
        let t = secs(8);
        let cache = growth(&t, &[1.28e6; 8]);
        assert_eq!(cache, Growth::default());
        // A 1 MiB burst caught by the last two snapshots of eight.
        let m = 1048576.0;
        let burst = growth(&t, &[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, m, m]);
        // By hand: slope = 6 MiB / 42 s, R² = 36 / (42 × 1.5), one interval of seven grew.
        assert!((burst.slope - 6.0 * m / 42.0).abs() < 1e-6, "{burst:?}");
        assert!((burst.r2 - 36.0 / 63.0).abs() < 1e-12, "{burst:?}");
        assert!((burst.grew - 1.0 / 7.0).abs() < 1e-12);
        // 16 of the 28 pairs are before or after the step: the median slope is 0.
        assert_eq!(burst.median_slope, 0.0);
        assert_eq!(burst.score, 0.0);
        // A leak of 10 KiB/s: far less than the burst's slope, yet ranked first.
        let leak: Vec<f64> = t.iter().map(|s| 5e5 + 10240.0 * s).collect();
        let leak = growth(&t, &leak);
        assert!(leak.score > 10000.0, "{leak:?}");
        // A burst caught in the middle (3 of 8 snapshots) scores 0 too.
        let mid = growth(&t, &[0.0, 0.0, 0.0, m, m, m, 0.0, 0.0]);
        assert_eq!(mid.score, 0.0, "{mid:?}");
        // A one-off step in the middle of the window (helper A: a 5 MB warm-up 8 s into 14)
        // beside a 10 KiB/s leak: most pairs span the step, so its Theil–Sen slope is large,
        // but all its growth comes from one interval.
        let t = secs(14);
        let step: Vec<f64> = t.iter().map(|&s| if s < 7.0 { 0.0 } else { 5e6 }).collect();
        let step = growth(&t, &step);
        assert!(step.median_slope > 1e5, "{step:?}");
        assert_eq!(step.score, 0.0, "{step:?}");
        let leak: Vec<f64> = t.iter().map(|s| 1e4 + 10240.0 * s).collect();
        let leak = growth(&t, &leak);
        assert!((leak.score - 10240.0).abs() < 1e-6, "{leak:?}");
        // A leak with a step on top still ranks (its other intervals grow too).
        let both: Vec<f64> = t
            .iter()
            .map(|&s| 10240.0 * s + if s < 7.0 { 0.0 } else { 1e5 })
            .collect();
        assert!(growth(&t, &both).score > 1000.0);
        // A shrinking series scores 0.
        let shrink = growth(&t, &[8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0]);
        assert!(shrink.slope < 0.0);
        assert_eq!(shrink.score, 0.0);
    }

    /// Helper I, 3: a leak begun in the last 27% of 62 snapshots scored 0 over the whole
    /// window (its Theil–Sen slope is 0) and ranked below a one-off 1 MB step; scored over
    /// the recent stretch where it grows, it ranks first, at its own slope. A sawtooth cache
    /// whose last rise stays below its earlier peaks gains nothing from the recent stretches.
    #[test]
    fn a_leak_begun_late_ranks_by_its_recent_growth() {
        let t = secs(62);
        let late: Vec<f64> = t.iter().map(|&s| 20_000.0 * (s - 45.0).max(0.0)).collect();
        let late = growth(&t, &late);
        assert!((late.median_slope - 20_000.0).abs() < 1e-6, "{late:?}");
        assert!((late.score - 20_000.0).abs() < 1e-6, "{late:?}");
        // The last quarter (from 47 s) lies on the leak's line.
        assert_eq!(late.since, 47.0, "{late:?}");
        let step: Vec<f64> = t.iter().map(|&s| if s < 2.0 { 0.0 } else { 1e6 }).collect();
        let step = growth(&t, &step);
        assert!(step.score < 1.0, "{step:?}");
        assert_eq!(step.since, 0.0);
        // 64 KiB every 2 s for 16 s, then freed; the last rise (16 s) reaches no new high.
        let saw: Vec<f64> = t
            .iter()
            .map(|&s| 65536.0 * ((s as u64 % 16) / 2) as f64)
            .collect();
        let saw_g = growth(&t, &saw);
        assert_eq!(saw_g.since, 0.0, "{saw_g:?}");
        assert!(saw_g.score < 1000.0, "{saw_g:?}");
        // A steady leak keeps its whole-window score.
        let leak: Vec<f64> = t.iter().map(|s| 1e4 + 10240.0 * s).collect();
        let leak = growth(&t, &leak);
        assert!((leak.score - 10240.0).abs() < 1e-6, "{leak:?}");
        assert_eq!(leak.since, 0.0);
    }

    /// Helper R, 3: a steady leak sampled with the jitter of real snapshots (times a few ms
    /// late, values off by the blocks in flight) is shown over the whole window, not as
    /// begun in its last stretch.
    #[test]
    fn a_steady_leak_with_noise_is_not_called_recent() {
        for seed in 0..50u64 {
            let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut noise = || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % 2001) as f64 / 1000.0 - 1.0 // [-1, 1]
            };
            let t: Vec<f64> = (0..150).map(|i| i as f64 + 0.004 * noise()).collect();
            let v: Vec<f64> = t
                .iter()
                .map(|s| 60_000.0 + 50_000.0 * s + 5_000.0 * noise())
                .collect();
            let g = growth(&t, &v);
            assert!(g.since < 1.0, "seed {seed}: {g:?}");
            assert!(
                (g.median_slope - 50_000.0).abs() < 500.0,
                "seed {seed}: {g:?}"
            );
        }
    }

    #[test]
    fn too_few_points() {
        assert_eq!(growth(&[1.0], &[5.0]), Growth::default());
        assert_eq!(growth(&[], &[]), Growth::default());
        assert_eq!(growth(&[2.0, 2.0], &[1.0, 9.0]), Growth::default());
    }
}
