//! Scoring many sequences in one call on the CPU: each as `score` alone, context excluded, greedy, progress, and
//! error paths.

mod common;

use std::ops::ControlFlow;

use common::{fixture, Rng};
use tinyloop::{Backend, Error, Model, ScoreOptions, Sequence};

const VOCAB: usize = 256;
const MAX_SEQ: usize = 128;

fn cpu() -> ScoreOptions {
    ScoreOptions { backend: Backend::Cpu, ..ScoreOptions::default() }
}

fn close(a: f64, b: f64, relative: f64) -> bool {
    (a - b).abs() <= relative * a.abs().max(b.abs()).max(1e-12)
}

#[test]
fn each_sequence_scores_as_score_alone() {
    let model = Model::load(fixture()).unwrap();
    let mut rng = Rng::new();
    let cases = [(2, 0), (30, 1), (MAX_SEQ, 0), (45, 20), (17, 16)];
    let tokens: Vec<Vec<i32>> = cases.iter().map(|&(n, _)| rng.tokens(n, VOCAB)).collect();
    let sequences: Vec<Sequence> =
        cases.iter().zip(&tokens).map(|(&(_, context), t)| Sequence::with_context(t, context)).collect();
    let (scores, total) = model.score_batch(&sequences, &ScoreOptions { token_nll: true, ..cpu() }).unwrap();
    assert_eq!(scores.len(), cases.len());
    assert_eq!((total.backend, total.n_windows), (Backend::Cpu, cases.len()));
    let batch_nll = total.token_nll.expect("token_nll was requested");
    assert_eq!(batch_nll.len(), cases.iter().map(|&(n, _)| n - 1).sum::<usize>());

    let mut offset = 0;
    for ((sequence, score), &(n, context)) in sequences.iter().zip(&scores).zip(&cases) {
        let alone = model.score(sequence.tokens, &ScoreOptions { token_nll: true, ..cpu() }).unwrap();
        let alone_nll = alone.token_nll.unwrap();
        assert_eq!(&batch_nll[offset..offset + n - 1], &alone_nll[..], "n {n}: token_nll differs from score alone");
        let first = context.max(1);
        assert_eq!(score.tokens_scored, (n - first) as u64);
        let scored: f64 = alone_nll[first - 1..].iter().map(|&v| f64::from(v)).sum();
        assert!(close(score.nll_sum, scored, 1e-6), "n {n}: nll_sum {} vs the scored tokens' {scored}", score.nll_sum);
        if first == 1 {
            assert!(close(score.nll_sum, alone.nll_sum, 1e-9), "n {n}: {} vs {}", score.nll_sum, alone.nll_sum);
        }
        assert!(close(score.perplexity(), (score.nll_sum / score.tokens_scored as f64).exp(), 1e-12));
        offset += n - 1;
    }
    assert_eq!(total.tokens_scored, scores.iter().map(|s| s.tokens_scored).sum::<u64>());
    assert!(close(total.nll_sum, scores.iter().map(|s| s.nll_sum).sum(), 1e-12));
}

/// With one scored token, greedy is exactly "no other continuation has a lower NLL" (all continuations share the
/// log-sum-exp, so the lowest NLL is the largest logit).
#[test]
fn greedy_is_the_lowest_nll_continuation() {
    let model = Model::load(fixture()).unwrap();
    let prefix = Rng::new().tokens(7, VOCAB);
    let rows: Vec<Vec<i32>> = (0..VOCAB as i32).map(|v| prefix.iter().copied().chain([v]).collect()).collect();
    let sequences: Vec<Sequence> = rows.iter().map(|row| Sequence::with_context(row, prefix.len())).collect();
    let (scores, _) = model.score_batch(&sequences, &cpu()).unwrap();
    let lowest = scores.iter().map(|s| s.nll_sum).fold(f64::INFINITY, f64::min);
    for (v, score) in scores.iter().enumerate() {
        assert_eq!(score.greedy, score.nll_sum == lowest, "token {v}: NLL {} (lowest {lowest})", score.nll_sum);
    }
    assert!(scores.iter().any(|s| s.greedy));
}

#[test]
fn an_empty_batch_is_fine() {
    let model = Model::load(fixture()).unwrap();
    // An empty literal says nothing of the id type (i32 or u32, see TokenId): it is named.
    let (scores, total) = model.score_batch::<i32>(&[], &ScoreOptions { token_nll: true, ..cpu() }).unwrap();
    assert!(scores.is_empty());
    assert_eq!((total.tokens_scored, total.nll_sum, total.n_windows), (0, 0.0, 0));
    assert_eq!(total.token_nll, Some(Vec::new()));
}

#[test]
fn progress_counts_scored_tokens_and_can_cancel() {
    let model = Model::load(fixture()).unwrap();
    let tokens = Rng::new().tokens(40, VOCAB);
    let sequences = [Sequence::with_context(&tokens, 30), Sequence::new(&tokens[..12]), Sequence::new(&tokens)];
    let mut calls = Vec::new();
    let (_, total) = model
        .score_batch_with_progress(&sequences, &cpu(), |done, total| {
            calls.push((done, total));
            ControlFlow::Continue(())
        })
        .unwrap();
    // The CPU backend reports after each sequence.
    assert_eq!(calls, [(10, 60), (21, 60), (60, 60)]);
    assert_eq!(total.tokens_scored, 60);

    let mut cancelled_calls = 0;
    let cancelled = model.score_batch_with_progress(&sequences, &cpu(), |_, _| {
        cancelled_calls += 1;
        ControlFlow::Break(())
    });
    assert!(matches!(cancelled, Err(Error::Cancelled(_))), "{cancelled:?}");
    assert_eq!(cancelled_calls, 1);
}

#[test]
fn bad_sequences_are_invalid_arguments_naming_them() {
    let model = Model::load(fixture()).unwrap();
    let tokens = Rng::new().tokens(MAX_SEQ + 1, VOCAB);
    let mut bad_token = tokens[..10].to_vec();
    bad_token[4] = VOCAB as i32;
    let expect_invalid =
        |sequences: &[Sequence], options: &ScoreOptions, needle: &str| match model.score_batch(sequences, options) {
            Err(Error::InvalidArgument(message)) => assert!(message.contains(needle), "{needle}: {message}"),
            other => panic!("{needle}: expected InvalidArgument, got {other:?}"),
        };
    let good = Sequence::new(&tokens[..5]);
    expect_invalid(&[good, Sequence::new(&tokens[..1])], &cpu(), "sequences[1].n_tokens = 1");
    expect_invalid(&[good, Sequence::new(&[])], &cpu(), "sequences[1]");
    expect_invalid(&[Sequence::new(&tokens)], &cpu(), "sequences[0].n_tokens = 129");
    expect_invalid(&[good, good, Sequence::with_context(&tokens[..5], 5)], &cpu(), "sequences[2].n_context = 5");
    expect_invalid(&[good, Sequence::new(&bad_token)], &cpu(), "sequences[1].tokens[4] = 256");
    expect_invalid(&[good], &ScoreOptions { window: 16, ..cpu() }, "window = 16");
}

#[test]
fn an_empty_context_takes_the_given_beginning_of_text_token() {
    let model = Model::load(fixture()).unwrap();
    let tokens = Rng::new().tokens(9, VOCAB);
    let bos = 5i32;
    let spelled: Vec<i32> = std::iter::once(bos).chain(tokens.iter().copied()).collect();
    let with_bos =
        ScoreOptions { token_nll: true, empty_context_bos: tinyloop::EmptyContextBos::Token(bos as u32), ..cpu() };
    let (got, got_total) =
        model.score_batch(&[Sequence::new(&tokens[..]), Sequence::with_context(&tokens[..], 4)], &with_bos).unwrap();
    let (want, want_total) = model
        .score_batch(
            &[Sequence::with_context(&spelled[..], 1), Sequence::with_context(&tokens[..], 4)],
            &ScoreOptions { token_nll: true, ..cpu() },
        )
        .unwrap();
    assert_eq!(got, want);
    assert_eq!(got[0].tokens_scored, tokens.len() as u64);
    assert_eq!(got_total.token_nll, want_total.token_nll);
    // The fixture names no beginning-of-text token of its own.
    let from_model = ScoreOptions { empty_context_bos: tinyloop::EmptyContextBos::FromModel, ..cpu() };
    assert!(matches!(model.score_batch(&[Sequence::new(&tokens[..])], &from_model), Err(Error::InvalidArgument(_))));
}
