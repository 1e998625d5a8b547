//! `import_checkpoint` on Hugging Face-style folders that tests/import/make_looped_checkpoints.py writes (Python 3,
//! standard library only): a dense, a GPTQ and an act-order GPTQ checkpoint become models that load, score, and have
//! the script's configuration; a missing folder and an act-order checkpoint whose q, k and v order K differently are
//! refused with errors naming them.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Once;

use common::ScratchFile;
use tinyloop::{import_checkpoint, Backend, Error, HeadKind, ImportOptions, Model, ScoreOptions};

/// The script's checkpoints, written once per test process into a folder of its own.
fn checkpoints() -> PathBuf {
    static WRITTEN: Once = Once::new();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("looped-checkpoints-{}", std::process::id()));
    WRITTEN.call_once(|| {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/import/make_looped_checkpoints.py");
        let status = Command::new("python3").arg(&script).arg(&dir).status().expect("python3 runs");
        assert!(status.success(), "{} failed: {status}", script.display());
    });
    dir
}

#[test]
fn dense_and_gptq_checkpoints_become_models_that_score() {
    for (name, head, quantized) in [
        ("dense_f16_tied", HeadKind::Tied, false),
        ("gptq", HeadKind::Dense, true),
        ("gptq_act_order", HeadKind::Tied, true),
    ] {
        let out = ScratchFile::new(name);
        import_checkpoint(checkpoints().join(name), &out.0, &ImportOptions::default())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let model = Model::load(&out.0).unwrap();
        let info = model.info();
        // The script's config: D 64, 4 heads, FFN 96, vocab 72, 2 pre blocks + 1 looped 3 times.
        assert_eq!((info.d_model, info.n_heads, info.ffn, info.vocab), (64, 4, 96, 72), "{name}");
        assert_eq!((info.n_pre, info.n_loops), (2, 3), "{name}");
        assert_eq!(info.head_kind, head, "{name}");
        assert_eq!(model.weights().len() > 0, quantized, "{name}: INT4 linears");
        let tokens: Vec<i32> = (0..20).map(|i| (i * 7) % 72).collect();
        let options = ScoreOptions { backend: Backend::Cpu, ..ScoreOptions::default() };
        let result = model.score(&tokens, &options).unwrap();
        assert_eq!(result.tokens_scored, 19);
        assert!(result.nll_sum.is_finite() && result.nll_sum > 0.0, "{name}: NLL {}", result.nll_sum);
    }
}

#[test]
fn max_seq_option_is_written() {
    let out = ScratchFile::new("max_seq");
    let options = ImportOptions { max_seq: Some(48), ..ImportOptions::default() };
    import_checkpoint(checkpoints().join("dense_f16_tied"), &out.0, &options).unwrap();
    assert_eq!(Model::load(&out.0).unwrap().info().max_seq, 48);
    let zero = ImportOptions { max_seq: Some(0), ..ImportOptions::default() };
    assert!(matches!(import_checkpoint(checkpoints().join("dense_f16_tied"), &out.0, &zero),
                     Err(Error::InvalidArgument(m)) if m.contains("max_seq 0")));
}

#[test]
fn refusals_name_what_is_wrong() {
    let out = ScratchFile::new("refused");
    let missing = checkpoints().join("no-such-folder");
    match import_checkpoint(&missing, &out.0, &ImportOptions::default()) {
        Err(Error::Io(m)) => assert!(m.contains("no-such-folder"), "{m}"),
        other => panic!("a missing folder: {other:?}"),
    }
    match import_checkpoint(checkpoints().join("bad/act_order_kv_apart"), &out.0, &ImportOptions::default()) {
        Err(Error::Unsupported(m)) => assert!(m.contains("k_proj.g_idx' orders K differently"), "{m}"),
        other => panic!("q, k and v in different K orders: {other:?}"),
    }
    assert!(!out.0.exists(), "a failed import must not leave an output");
}
