//! Fixed log-linear latency buckets, shared by the writer and every reader.
//!
//! A value `v` (nanoseconds) below 32 has a bucket of its own; above that, each power
//! of two is split into 32 equal buckets, so a bucket is never wider than 1/32 of its
//! lower bound (about 3%). 1,920 buckets cover the whole `u64` range. Counting is one
//! relaxed `fetch_add` on the bucket; readers turn bucket deltas into percentiles.

/// Number of buckets.
pub const BUCKETS: usize = 1920;
const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;

/// The bucket holding `value`.
#[inline]
pub fn bucket_of(value: u64) -> usize {
    if value < SUB {
        return value as usize;
    }
    let exponent = 63 - value.leading_zeros();
    let sub = (value >> (exponent - SUB_BITS)) & (SUB - 1);
    ((exponent - SUB_BITS + 1) as u64 * SUB + sub) as usize
}

/// Buckets of a model's latency histogram: the buckets above from 1 µs (1,024 ns) up,
/// two merged into one (about 6% wide), up to 2⁴² ns (73 minutes); values below and
/// above count in the first and last.
pub const MODEL_BUCKETS: usize = 512;
/// `bucket_of(1024)`: where a model's histogram starts among the core buckets.
const MODEL_FIRST: usize = 192;

/// The model histogram bucket holding `value`.
#[inline]
pub fn model_bucket_of(value: u64) -> usize {
    (bucket_of(value).clamp(MODEL_FIRST, MODEL_FIRST + 2 * MODEL_BUCKETS - 1) - MODEL_FIRST) / 2
}

/// The smallest and largest value in model histogram bucket `bucket`.
pub fn model_bucket_bounds(bucket: usize) -> (u64, u64) {
    let low = if bucket == 0 { 0 } else { bucket_bounds(MODEL_FIRST + 2 * bucket).0 };
    let high = if bucket + 1 >= MODEL_BUCKETS { u64::MAX } else { bucket_bounds(MODEL_FIRST + 2 * bucket + 1).1 };
    (low, high)
}

/// The smallest and largest value in `bucket`.
pub fn bucket_bounds(bucket: usize) -> (u64, u64) {
    let bucket = bucket as u64;
    if bucket < SUB {
        return (bucket, bucket);
    }
    let shift = bucket / SUB - 1;
    let sub = bucket % SUB;
    let low = (SUB + sub) << shift;
    let width = 1u64 << shift;
    (low, low.saturating_add(width - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_falls_inside_its_bucket_bounds() {
        let mut values: Vec<u64> = (0..5000).collect();
        values.extend((0..64).flat_map(|s| [1u64 << s, (1u64 << s) - 1, (1u64 << s) + 1]));
        values.push(u64::MAX);
        for v in values {
            let b = bucket_of(v);
            assert!(b < BUCKETS, "{v} -> {b}");
            let (low, high) = bucket_bounds(b);
            assert!(low <= v && v <= high, "{v} in bucket {b} = [{low}, {high}]");
        }
    }

    #[test]
    fn buckets_are_contiguous_and_narrow() {
        for b in 1..BUCKETS {
            let (_, previous_high) = bucket_bounds(b - 1);
            let (low, high) = bucket_bounds(b);
            assert_eq!(low, previous_high + 1, "bucket {b}");
            assert!((high - low) as f64 <= low as f64 / 32.0 + 1.0, "bucket {b} [{low}, {high}] is too wide");
        }
        assert_eq!(bucket_bounds(BUCKETS - 1).1, u64::MAX);
    }

    #[test]
    fn model_buckets_cover_everything_and_are_about_six_percent_wide_in_range() {
        assert_eq!(bucket_of(1024), MODEL_FIRST);
        for v in [0, 1, 1023, 1024, 1500, 1 << 20, 27_100_000, (1 << 42) - 1, 1 << 42, u64::MAX] {
            let b = model_bucket_of(v);
            let (low, high) = model_bucket_bounds(b);
            assert!(b < MODEL_BUCKETS && low <= v && v <= high, "{v} -> {b} = [{low}, {high}]");
        }
        for b in 1..MODEL_BUCKETS - 1 {
            let (low, high) = model_bucket_bounds(b);
            assert_eq!(low, model_bucket_bounds(b - 1).1 + 1, "contiguous at {b}");
            assert!((high - low) as f64 <= low as f64 / 16.0 + 1.0, "bucket {b} [{low}, {high}]");
        }
    }
}
