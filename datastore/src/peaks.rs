//! The virtual NeuronCore's defined peak rates: the figures every "% of peak" and MFU
//! is measured against.
//!
//! A virtual core's engines run on host threads, so its peak is defined as the most
//! those threads' vector units can do: every thread issuing two vector operations per
//! cycle (two FMA pipes) at the widest width the CPU supports, at the clock the
//! kernel reports. A matrix product (PE) counts two FLOPs per lane per operation (a
//! fused multiply-add), twice that again where the runtime runs bf16 products on the
//! CPU's AVX512-BF16 instructions (`neuron-cc`'s default auto-cast), or sixteen times
//! (AVX-512's f32 rate) on AMX tiles ([`AMX_BF16_FLOPS_PER_CYCLE`]), each only
//! where it measured them faster than f32 on this host ([`ProductKernel`]): the peak is
//! that of the fastest products the backend runs here, as an accelerator's MFU is
//! against its bf16 peak. The other engines (ACT, DVE, POOL) count one FLOP per lane.
//! The clock is cpufreq's maximum when the kernel has it, else the highest "cpu MHz" of
//! `/proc/cpuinfo` (fixed in a VM; on a host that scales its clock without cpufreq,
//! the current one). The definition depends
//! only on the CPU, the number of threads and the product kernel (chosen with a
//! margin, so that it does not change from run to run), so it is the same in every run
//! on a host, and no measured rate can exceed it unless the CPU runs above the reported
//! clock (turbo), which a figure above 100% then says. The backend's measured matrix
//! product rate, which varies from run to run, is shown beside it as context only.
//!
//! The memory ceiling is measured here too ([`memory_bandwidth`]): what one host thread
//! copying moves per second, the roof every instruction's bytes are compared with.

use std::fmt;

/// FMA pipes assumed per thread: every x86-64 and Arm server core since 2013 has at most two.
pub const FMA_PIPES: u32 = 2;

/// FLOPs of bf16 products one thread's AMX unit does a cycle: a `tdpbf16ps` (16 × 16 ×
/// 32 multiply-adds) every 16 cycles, as Intel documents it for Sapphire Rapids.
pub const AMX_BF16_FLOPS_PER_CYCLE: f64 = 1024.0;

/// The host CPU's vector units, as `/proc/cpuinfo` describes them.
#[derive(Debug, Clone, PartialEq)]
pub struct HostVector {
    /// `avx512`, `avx2`, `sse2`, `neon`, or `scalar`.
    pub isa: &'static str,
    /// `f32` lanes of one vector operation.
    pub f32_lanes: u32,
    /// Products of bf16 pairs accumulate into f32 at twice the f32 rate (`avx512_bf16`).
    pub bf16_products: bool,
    /// The clock the kernel reports, in Hz (the highest over the CPUs).
    pub clock_hz: f64,
}

/// Defined peaks of one virtual NeuronCore, in FLOP/s.
#[derive(Debug, Clone, PartialEq)]
pub struct EnginePeaks {
    /// Matrix products (PE): a fused multiply-add is two FLOPs.
    pub pe_flops: f64,
    /// The vector engines (ACT, DVE, POOL): one FLOP per lane.
    pub vector_flops: f64,
    /// How the figures are defined, in words.
    pub basis: String,
}

/// Which kernel runs the matrix products whose operands are rounded to bf16 (the
/// default `--auto-cast matmult`), as the runtime measured when it started: the bf16
/// products of AVX512-BF16 only where they are faster than f32 on this host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ProductKernel {
    /// A file of an older runtime: the CPU's flags decide, as they did then.
    #[default]
    NotRecorded,
    /// f32 multiply-adds on the rounded operands.
    F32,
    /// bf16 products accumulated in f32 (`vdpbf16ps`).
    Bf16,
    /// bf16 products accumulated in f32 on AMX tiles (`tdpbf16ps`).
    Amx,
}

impl ProductKernel {
    /// Its code in the datastore header.
    pub fn code(self) -> u32 {
        match self {
            ProductKernel::NotRecorded => 0,
            ProductKernel::F32 => 1,
            ProductKernel::Bf16 => 2,
            ProductKernel::Amx => 3,
        }
    }

    /// From its code in the datastore header; unknown codes read as not recorded.
    pub fn from_code(code: u32) -> ProductKernel {
        match code {
            1 => ProductKernel::F32,
            2 => ProductKernel::Bf16,
            3 => ProductKernel::Amx,
            _ => ProductKernel::NotRecorded,
        }
    }
}

impl HostVector {
    /// This host's, from `/proc/cpuinfo` (and cpufreq's maximum when the kernel has it).
    pub fn detect() -> Option<HostVector> {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok()?;
        let max_khz = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
            .ok()
            .and_then(|t| t.trim().parse::<f64>().ok());
        HostVector::parse(&cpuinfo, max_khz)
    }

    /// From the text of `/proc/cpuinfo` and cpufreq's maximum in kHz.
    pub fn parse(cpuinfo: &str, cpufreq_max_khz: Option<f64>) -> Option<HostVector> {
        let field = |line: &str, name: &str| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == name).then(|| value.trim().to_owned())
        };
        let flags: Vec<String> = cpuinfo
            .lines()
            .find_map(|l| field(l, "flags").or_else(|| field(l, "Features")))
            .map(|f| f.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default();
        let has = |flag: &str| flags.iter().any(|f| f == flag);
        let (isa, f32_lanes) = if has("avx512f") {
            ("avx512", 16)
        } else if has("avx2") {
            ("avx2", 8)
        } else if has("sse2") {
            ("sse2", 4)
        } else if has("asimd") {
            ("neon", 4)
        } else {
            ("scalar", 1)
        };
        let reported_mhz =
            cpuinfo.lines().filter_map(|l| field(l, "cpu MHz")?.parse::<f64>().ok()).fold(0.0f64, f64::max);
        let clock_hz = (reported_mhz * 1e6).max(cpufreq_max_khz.unwrap_or(0.0) * 1e3);
        let bf16_products = has("avx512_bf16");
        (clock_hz > 0.0).then_some(HostVector { isa, f32_lanes, bf16_products, clock_hz })
    }

    /// The peaks of a virtual core that computes on `threads` host threads, its bf16
    /// products on `kernel`: PE's peak doubles only where the runtime found the bf16
    /// products faster than f32 (or, for files that do not say, where the CPU has them).
    pub fn peaks(&self, threads: u32, kernel: ProductKernel) -> EnginePeaks {
        let threads = threads.max(1);
        let vector_flops = f64::from(threads) * f64::from(self.f32_lanes) * f64::from(FMA_PIPES) * self.clock_hz;
        // PE's products per f32 multiply-add rate: one tile product is a thread's
        // AMX_BF16_FLOPS_PER_CYCLE, the f32 rate 2 × lanes × pipes a cycle.
        let amx = AMX_BF16_FLOPS_PER_CYCLE / f64::from(2 * self.f32_lanes * FMA_PIPES);
        let (factor, bf16_note) = match (kernel, self.bf16_products) {
            (ProductKernel::NotRecorded, true) => (2.0, ", ×2 for bf16 products (AVX512-BF16)".to_owned()),
            (ProductKernel::Bf16, _) => {
                (2.0, ", ×2 for bf16 products (AVX512-BF16, measured faster than f32 on this host)".to_owned())
            }
            (ProductKernel::Amx, _) => (
                amx,
                format!(
                    ", ×{amx} for bf16 products on AMX tiles ({AMX_BF16_FLOPS_PER_CYCLE} FLOP per cycle per thread, \
                     measured faster than f32 on this host)"
                ),
            ),
            (ProductKernel::F32, true) => (
                1.0,
                ", bf16 products at the f32 rate (AVX512-BF16 measured no faster than f32 on this host)".to_owned(),
            ),
            _ => (1.0, String::new()),
        };
        EnginePeaks {
            pe_flops: 2.0 * factor * vector_flops,
            vector_flops,
            basis: format!(
                "{threads} host thread{} × {} f32 lanes ({}) × {FMA_PIPES} FMA pipes × {:.2} GHz, ×2 for PE's multiply-add{}",
                if threads == 1 { "" } else { "s" },
                self.f32_lanes,
                self.isa,
                self.clock_hz / 1e9,
                bf16_note
            ),
        }
    }
}

impl fmt::Display for EnginePeaks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PE {:.1} GFLOP/s, ACT/DVE/POOL {:.1} GFLOP/s", self.pe_flops / 1e9, self.vector_flops / 1e9)
    }
}

/// How [`memory_bandwidth`] measures.
pub const MEMORY_BANDWIDTH_METHOD: &str =
    "the best of 5 copies of 16 MiB on one host thread, after one to warm up, counting the bytes read and written";

/// The host's memory bandwidth as one thread copying sees it (bytes read plus written
/// per second), measured once per process: the memory ceiling instructions are
/// compared with.
pub fn memory_bandwidth() -> f64 {
    static MEASURED: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *MEASURED.get_or_init(|| {
        const BYTES: usize = 16 << 20;
        let source = vec![1u8; BYTES];
        let mut destination = vec![0u8; BYTES];
        destination.copy_from_slice(&source);
        let best = (0..5)
            .map(|_| {
                let started = std::time::Instant::now();
                destination.copy_from_slice(std::hint::black_box(&source));
                std::hint::black_box(&destination);
                started.elapsed()
            })
            .min()
            .unwrap_or_default();
        2.0 * BYTES as f64 / best.as_secs_f64().max(1e-9)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_widest_vector_and_the_highest_clock_define_the_peak() {
        let cpuinfo = "processor\t: 0\ncpu MHz\t\t: 2596.132\nflags\t\t: fpu sse2 avx2 fma avx512f\n\n\
                       processor\t: 1\ncpu MHz\t\t: 2400.000\nflags\t\t: fpu sse2 avx2 fma avx512f\n";
        let bf16 = HostVector::parse(&cpuinfo.replace("avx512f", "avx512f avx512_bf16"), None).expect("parsed");
        assert!(bf16.bf16_products);
        let recorded = bf16.peaks(2, ProductKernel::NotRecorded);
        assert!((recorded.pe_flops / 1e9 - 664.61).abs() < 0.01, "bf16 products double PE's peak");
        assert!(recorded.basis.ends_with("×2 for bf16 products (AVX512-BF16)"));
        // Issue 39: only where the runtime measured them faster than f32.
        let faster = bf16.peaks(2, ProductKernel::Bf16);
        assert!((faster.pe_flops / 1e9 - 664.61).abs() < 0.01);
        assert!(faster.basis.ends_with("measured faster than f32 on this host)"), "{}", faster.basis);
        let slower = bf16.peaks(2, ProductKernel::F32);
        assert!((slower.pe_flops / 1e9 - 332.30).abs() < 0.01, "at the f32 rate: {slower}");
        assert!(slower.basis.ends_with("(AVX512-BF16 measured no faster than f32 on this host)"), "{}", slower.basis);
        // On AMX tiles: 1,024 FLOP a cycle per thread, 16 times AVX-512's f32 multiply-adds.
        let tiles = bf16.peaks(2, ProductKernel::Amx);
        assert!((tiles.pe_flops / 1e9 - 2.0 * 1024.0 * 2.596132).abs() < 0.01, "{tiles}");
        assert!(tiles.basis.contains("×16 for bf16 products on AMX tiles"), "{}", tiles.basis);
        assert_eq!(ProductKernel::from_code(ProductKernel::Amx.code()), ProductKernel::Amx);
        let host = HostVector::parse(cpuinfo, None).expect("parsed");
        assert_eq!((host.isa, host.f32_lanes), ("avx512", 16));
        assert!((host.clock_hz - 2.596132e9).abs() < 1.0);
        let peaks = host.peaks(2, ProductKernel::NotRecorded);
        // 2 threads × 16 lanes × 2 pipes × 2.596 GHz = 166.2 GFLOP/s; PE twice that.
        assert!((peaks.vector_flops / 1e9 - 166.15).abs() < 0.01, "{peaks}");
        assert!((peaks.pe_flops / peaks.vector_flops - 2.0).abs() < 1e-12);
        assert!(peaks.basis.starts_with("2 host threads × 16 f32 lanes (avx512)"), "{}", peaks.basis);
        assert_eq!(host.peaks(2, ProductKernel::F32), peaks, "no bf16 instructions, no note");
        let turbo = HostVector::parse(cpuinfo, Some(3_700_000.0)).expect("parsed");
        assert!((turbo.clock_hz - 3.7e9).abs() < 1.0, "cpufreq's maximum wins when higher");
    }

    #[test]
    fn older_and_other_cpus_have_narrower_vectors() {
        let lanes =
            |flags: &str| HostVector::parse(&format!("cpu MHz : 1000\nflags : {flags}\n"), None).map(|h| h.f32_lanes);
        assert_eq!(lanes("sse2 avx2"), Some(8));
        assert_eq!(lanes("sse sse2"), Some(4));
        assert_eq!(lanes("fpu"), Some(1));
        let arm = HostVector::parse("Features : fp asimd\n", Some(2_000_000.0)).expect("arm");
        assert_eq!((arm.isa, arm.f32_lanes), ("neon", 4));
        assert_eq!(HostVector::parse("flags : avx2\n", None), None, "no clock, no peak");
    }
}
