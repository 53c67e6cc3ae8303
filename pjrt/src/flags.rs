//! `NEURON_CC_FLAGS`: the `neuronx-cc` flags a torch-neuronx script sets for every
//! graph it compiles (`--auto-cast none`, `-O1`, `--target trn1`, …).

use neuron_runtime::{AutoCast, AutoCastType, CompileOptions, OptLevel, Target};

/// What `NEURON_CC_FLAGS` says of the compile cache (`--cache_dir`, `--no-cache`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CacheFlags {
    pub(crate) dir: Option<String>,
    pub(crate) disabled: bool,
}

/// The compile options of `flags` over the defaults of `target`; a flag this compiler
/// does not know is reported once, by name, and ignored (as `neuronx-cc` flags about
/// its own internals are meaningless here).
pub(crate) fn compile_options(
    flags: &str,
    target: Target,
) -> Result<(CompileOptions, CacheFlags, Vec<String>), String> {
    let mut options = CompileOptions::new(target);
    let mut cache = CacheFlags::default();
    let mut ignored = Vec::new();
    let mut words = flags.split_whitespace().peekable();
    while let Some(word) = words.next() {
        let (flag, inline) = match word.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag, Some(value.to_owned())),
            _ => (word, None),
        };
        let mut value = |name: &str| -> Result<String, String> {
            inline
                .clone()
                .or_else(|| words.next_if(|w| !w.starts_with('-')).map(str::to_owned))
                .ok_or_else(|| format!("NEURON_CC_FLAGS: `{name}` needs a value"))
        };
        let bad = |name: &str, e: String| format!("NEURON_CC_FLAGS: {name}: {e}");
        match flag {
            "--auto-cast" => options.auto_cast = value(flag)?.parse::<AutoCast>().map_err(|e| bad(flag, e))?,
            "--auto-cast-type" => {
                options.auto_cast_type = value(flag)?.parse::<AutoCastType>().map_err(|e| bad(flag, e))?
            }
            "--optlevel" => options.optlevel = value(flag)?.parse::<OptLevel>().map_err(|e| bad(flag, e))?,
            "-O1" | "-O2" | "-O3" => options.optlevel = flag[2..].parse::<OptLevel>().map_err(|e| bad(flag, e))?,
            "--target" => options.target = value(flag)?.parse::<Target>().map_err(|e| bad(flag, e))?,
            "--enable-mixed-precision-accumulation" => options.mixed_precision_accumulation = true,
            "--enable-saturate-infinity" => options.saturate_infinity = true,
            "--cache_dir" => cache.dir = Some(value(flag)?),
            "--no-cache" => cache.disabled = true,
            _ => {
                // A flag with a separate value: skip the value with it.
                if inline.is_none() && flag.starts_with("--") {
                    let _ = words.next_if(|w| !w.starts_with('-'));
                }
                ignored.push(flag.to_owned());
            }
        }
    }
    Ok((options, cache, ignored))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_set_the_options_and_unknown_flags_are_named() {
        let (options, cache, ignored) = compile_options(
            "--auto-cast none -O1 --model-type=transformer --target trn2 --verbose info --cache_dir=/tmp/c",
            Target::Trn1,
        )
        .expect("valid");
        assert_eq!(options.auto_cast, AutoCast::None);
        assert_eq!(options.optlevel, "1".parse::<OptLevel>().expect("valid"));
        assert_eq!(options.target, Target::Trn2);
        assert_eq!(ignored, ["--model-type", "--verbose"]);
        assert_eq!(cache, CacheFlags { dir: Some("/tmp/c".into()), disabled: false });
        let error = compile_options("--auto-cast sometimes", Target::Trn1).expect_err("refused");
        assert!(error.contains("--auto-cast") && error.contains("sometimes"), "{error}");
        assert!(compile_options("--auto-cast", Target::Trn1).expect_err("refused").contains("needs a value"));
    }
}
