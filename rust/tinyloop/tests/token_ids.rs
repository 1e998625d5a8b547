//! `u32` token ids, as tokenizers and candle give them: they score exactly as the same ids in `i32`, through every
//! scoring function, and an id above `i32::MAX` is refused by name before the library is called. The `i32` forms
//! that callers wrote before keep compiling.

mod common;

use std::ops::ControlFlow;

use common::{fixture, Rng};
use tinyloop::{Backend, Error, Model, ScoreOptions, Sequence};

const VOCAB: usize = 256;

fn cpu() -> ScoreOptions {
    ScoreOptions { backend: Backend::Cpu, token_nll: true, ..ScoreOptions::default() }
}

fn as_u32(tokens: &[i32]) -> Vec<u32> {
    tokens.iter().map(|&t| u32::try_from(t).unwrap()).collect()
}

fn expect_invalid<T: std::fmt::Debug>(result: tinyloop::Result<T>, needles: &[&str]) {
    match result {
        Err(Error::InvalidArgument(message)) => {
            for needle in needles {
                assert!(message.contains(needle), "{needle:?} not in {message:?}");
            }
        }
        other => panic!("expected InvalidArgument naming {needles:?}, got {other:?}"),
    }
}

#[test]
fn u32_ids_score_as_the_same_i32_ids() {
    let model = Model::load(fixture()).unwrap();
    let tokens = Rng::new().tokens(300, VOCAB);
    let ids = as_u32(&tokens);
    let options = ScoreOptions { window: 64, ..cpu() };
    let expected = model.score(&tokens, &options).unwrap();
    let got = model.score(&ids, &options).unwrap();
    assert_eq!(
        (got.nll_sum, got.tokens_scored, got.n_windows, &got.token_nll),
        (expected.nll_sum, expected.tokens_scored, expected.n_windows, &expected.token_nll)
    );
    let mut calls = 0;
    let with_progress = model
        .score_with_progress(&ids, &options, |_, _| {
            calls += 1;
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(with_progress.nll_sum, expected.nll_sum);
    assert_eq!(calls, expected.n_windows);
}

#[test]
fn u32_sequences_score_as_the_same_i32_sequences() {
    let model = Model::load(fixture()).unwrap();
    let mut rng = Rng::new();
    let tokens: Vec<Vec<i32>> = [40, 2, 128, 17].iter().map(|&n| rng.tokens(n, VOCAB)).collect();
    let ids: Vec<Vec<u32>> = tokens.iter().map(|t| as_u32(t)).collect();
    let contexts = [10, 0, 1, 16];
    let sequences: Vec<Sequence> = tokens.iter().zip(contexts).map(|(t, c)| Sequence::with_context(t, c)).collect();
    let u32_sequences: Vec<Sequence<u32>> =
        ids.iter().zip(contexts).map(|(t, c)| Sequence::with_context(t, c)).collect();
    let (expected, expected_total) = model.score_batch(&sequences, &cpu()).unwrap();
    let (got, got_total) = model.score_batch(&u32_sequences, &cpu()).unwrap();
    assert_eq!(got, expected);
    assert_eq!((got_total.nll_sum, &got_total.token_nll), (expected_total.nll_sum, &expected_total.token_nll));
    let (with_progress, _) =
        model.score_batch_with_progress(&u32_sequences, &cpu(), |_, _| ControlFlow::Continue(())).unwrap();
    assert_eq!(with_progress, expected);
}

#[test]
fn ids_above_i32_max_are_invalid_arguments_naming_them() {
    let model = Model::load(fixture()).unwrap();
    let mut ids: Vec<u32> = (0..20).collect();
    for bad in [u32::MAX, i32::MAX as u32 + 1] {
        ids[7] = bad;
        expect_invalid(model.score(&ids, &cpu()), &[&format!("tokens[7] = {bad}"), "i32::MAX"]);
        // Refused before the library runs: the progress closure is never called.
        let mut called = false;
        let result = model.score_with_progress(&ids, &cpu(), |_, _| {
            called = true;
            ControlFlow::Continue(())
        });
        expect_invalid(result, &[&format!("tokens[7] = {bad}")]);
        assert!(!called);
    }
    // i32::MAX itself is an id the C API can take; the library refuses it as outside the vocabulary.
    ids[7] = i32::MAX as u32;
    expect_invalid(model.score(&ids, &cpu()), &["tokens[7] = 2147483647", "vocabulary"]);

    let good: Vec<u32> = (1..10).collect();
    let mut bad = good.clone();
    bad[2] = 1 << 31;
    let sequences = [Sequence::new(&good), Sequence::with_context(&bad, 3)];
    expect_invalid(model.score_batch(&sequences, &cpu()), &["sequences[1].tokens[2] = 2147483648", "i32::MAX"]);
    expect_invalid(
        model.score_batch_with_progress(&sequences, &cpu(), |_, _| ControlFlow::Continue(())),
        &["sequences[1].tokens[2] = 2147483648"],
    );
}

/// The forms callers used with `i32` ids before `u32` came in: a `&Vec<i32>`, an array of integer literals, a
/// `Vec<Sequence>` with the default id type, a sequence struct literal.
#[test]
fn the_i32_forms_still_compile_and_score() {
    let model = Model::load(fixture()).unwrap();
    let tokens: Vec<i32> = vec![72, 101, 108, 108, 111];
    let a = model.score(&tokens, &cpu()).unwrap();
    let b = model.score(&[72, 101, 108, 108, 111], &cpu()).unwrap();
    assert_eq!(a.nll_sum, b.nll_sum);
    let sequences: Vec<Sequence> = vec![Sequence::new(&tokens), Sequence { tokens: &tokens, n_context: 2 }];
    let first: &[i32] = sequences[0].tokens;
    assert_eq!(first, &tokens[..]);
    let (scores, _) = model.score_batch(&sequences, &cpu()).unwrap();
    assert_eq!(scores[0].nll_sum, a.nll_sum);
}
