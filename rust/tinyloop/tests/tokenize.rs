//! `Model::tokenizer`, `tokenize` and `detokenize`: byte-level on the committed fixture, and the tokenizers that
//! tests/text/make_tokenizer_cases.py writes (it needs Debian's python3-regex and python3-sentencepiece: the
//! interpreter is $TL_PYTHON, else /usr/bin/python3, else python3) imported with `import_checkpoint`, each case's ids
//! against the script's independent reference ids (cases.tsv), and threads sharing one model.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Once;

use common::{fixture, ScratchFile};
use tinyloop::{import_checkpoint, Error, ImportOptions, Model, TokenizerKind};

/// The script's output, written once per test process into a folder of its own.
fn cases_dir() -> PathBuf {
    static WRITTEN: Once = Once::new();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("tokenizer-cases-{}", std::process::id()));
    WRITTEN.call_once(|| {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/text/make_tokenizer_cases.py");
        let python = std::env::var_os("TL_PYTHON").map(PathBuf::from).unwrap_or_else(|| {
            let debian = PathBuf::from("/usr/bin/python3");
            if debian.is_file() { debian } else { PathBuf::from("python3") }
        });
        let status = Command::new(&python).arg(&script).arg(&dir).status().expect("python runs");
        assert!(status.success(), "{} {} failed: {status}", python.display(), script.display());
    });
    dir
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
}

/// (case name, text, ids, decoded) of one tokenizer in cases.tsv.
fn cases(dir: &Path, tokenizer: &str) -> Vec<(String, Vec<u8>, Vec<i32>, Vec<u8>)> {
    let table = std::fs::read_to_string(dir.join("cases.tsv")).unwrap();
    let rows: Vec<_> = table
        .lines()
        .map(|line| line.split('\t').collect::<Vec<_>>())
        .filter(|fields| fields[0] == tokenizer)
        .map(|f| {
            let ids = f[3].split_whitespace().map(|id| id.parse().unwrap()).collect();
            (f[1].to_string(), unhex(f[2]), ids, unhex(f[4]))
        })
        .collect();
    assert!(rows.len() > 10, "cases.tsv has {} cases of {tokenizer}", rows.len());
    rows
}

fn imported(name: &str) -> (Model, ScratchFile) {
    let out = ScratchFile::new(name);
    import_checkpoint(cases_dir().join(format!("ckpt_{name}")), &out.0, &ImportOptions::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    (Model::load(&out.0).unwrap(), out)
}

#[test]
fn a_model_without_a_tokenizer_reads_bytes() {
    let model = Model::load(fixture()).unwrap();
    let info = model.tokenizer().unwrap();
    assert_eq!((info.kind, info.n_ids), (TokenizerKind::Bytes, 256));
    assert_eq!(model.tokenize("Hé").unwrap(), vec![72, 195, 169]);
    assert_eq!(model.tokenize(b"\xff\x00").unwrap(), vec![255, 0]); // any bytes
    assert_eq!(model.tokenize("").unwrap(), Vec::<i32>::new());
    assert_eq!(model.detokenize(&[72, 195, 169]).unwrap(), "Hé".as_bytes());
    assert!(matches!(model.detokenize(&[1, 256]), Err(Error::InvalidArgument(m)) if m.contains("ids[1] = 256")));
}

#[test]
fn imported_tokenizers_give_the_reference_ids() {
    for (name, kind) in [
        ("gpt2", TokenizerKind::HuggingFace),
        ("llama3", TokenizerKind::HuggingFace),
        ("qwen2", TokenizerKind::HuggingFace),
        ("sentencepiece", TokenizerKind::SentencePiece),
    ] {
        let (model, _file) = imported(name);
        assert_eq!(model.tokenizer().unwrap().kind, kind, "{name}");
        for (case, text, ids, decoded) in cases(&cases_dir(), name) {
            assert_eq!(model.tokenize(&text).unwrap(), ids, "{name} / {case}");
            assert_eq!(model.detokenize(&ids).unwrap(), decoded, "{name} / {case}");
        }
        // Not UTF-8: refused, naming the offset.
        assert!(matches!(model.tokenize(b"ok \xc3("), Err(Error::InvalidArgument(m)) if m.contains("byte 3")),
                "{name}");
        let n_ids = model.tokenizer().unwrap().n_ids as i32;
        assert!(matches!(model.detokenize(&[0, n_ids]), Err(Error::InvalidArgument(m)) if m.contains("ids[1]")));
        // The ids score.
        let tokens = model.tokenize("Hello world, hello tokens").unwrap();
        assert!(model.score(&tokens, &Default::default()).unwrap().nll_sum.is_finite());
    }
}

#[test]
fn threads_share_one_model() {
    let (model, _file) = imported("llama3");
    let rows = cases(&cases_dir(), "llama3");
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..10 {
                    for (case, text, ids, _) in &rows {
                        assert_eq!(&model.tokenize(text).unwrap(), ids, "{case}");
                    }
                }
            });
        }
    });
}
