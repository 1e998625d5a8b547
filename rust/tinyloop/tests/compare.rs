//! Model::compare and Model::top_logprobs on the fixture, on the CPU backend.

mod common;

use common::fixture;
use tinyloop::{Activations, Backend, CompareOptions, Error, Model, ScoreOptions};

fn tokens(n: usize) -> Vec<i32> {
    (0..n).map(|i| ((i * 37 + 11) % 256) as i32).collect()
}

#[test]
fn a_model_against_itself_has_no_divergence() {
    let model = Model::load(fixture()).unwrap();
    let options = CompareOptions { backend: Backend::Cpu, window: 40, per_position: true, ..CompareOptions::default() };
    let result = model.compare(&model, &tokens(100), &options).unwrap();
    assert_eq!(result.tokens_scored, 99);
    assert_eq!(result.n_windows, 3);
    assert_eq!(result.kl_mean, 0.0);
    assert_eq!(result.kl_max, 0.0);
    assert_eq!(result.top1_agreement, 1.0);
    assert_eq!(result.perplexity_ratio, 1.0);
    let positions = result.per_position.unwrap();
    assert!(positions.kl.iter().all(|&kl| kl == 0.0));
    assert!(positions.top1_match.iter().all(|&m| m));
    assert_eq!(positions.nll_reference, positions.nll_test);
    let scored = model
        .score(&tokens(100), &ScoreOptions { backend: Backend::Cpu, window: 40, ..ScoreOptions::default() })
        .unwrap();
    assert!((result.perplexity_reference - scored.perplexity).abs() <= 1e-6 * scored.perplexity);
}

#[test]
fn compare_refuses_too_few_tokens() {
    let model = Model::load(fixture()).unwrap();
    let options = CompareOptions { backend: Backend::Cpu, ..CompareOptions::default() };
    assert!(matches!(model.compare(&model, &[1i32], &options), Err(Error::InvalidArgument(_))));
}

#[test]
fn top_logprobs_are_sorted_and_agree_with_the_nll() {
    let model = Model::load(fixture()).unwrap();
    let options = ScoreOptions { backend: Backend::Cpu, token_nll: true, ..ScoreOptions::default() };
    let ids = tokens(60);
    let k = 4;
    let (top, logprobs) = model.top_logprobs(&ids, k, &options).unwrap();
    assert_eq!(top.len(), 59 * k);
    assert_eq!(logprobs.len(), 59 * k);
    let nll = model.score(&ids, &options).unwrap().token_nll.unwrap();
    for i in 0..59 {
        let row = &logprobs[i * k..(i + 1) * k];
        assert!(row.windows(2).all(|w| w[0] >= w[1]), "position {i}: {row:?}");
        for j in 0..k {
            if top[i * k + j] == ids[i + 1] {
                assert!((-row[j] - nll[i]).abs() <= 1e-4 * nll[i].max(1.0), "position {i}");
            }
        }
    }
    assert!(matches!(model.top_logprobs(&ids, 21, &options), Err(Error::InvalidArgument(_))));
}

#[test]
fn the_fixture_names_no_bos_nor_grouped_heads_nor_rope_scaling() {
    let model = Model::load(fixture()).unwrap();
    let info = model.info();
    assert_eq!(info.bos_token_id, None);
    assert_eq!(info.n_kv_heads, Some(info.n_heads));
    assert_eq!(info.rope_scaling, Some(tinyloop::RopeScaling::None));
}

#[test]
fn quantized_activations_score_close_to_fp16_and_compare_measures_them() {
    let model = Model::load(fixture()).unwrap();
    let cpu = ScoreOptions { backend: Backend::Cpu, ..ScoreOptions::default() };
    let fp16 = model.score(&tokens(120), &cpu).unwrap();
    for mode in [Activations::Int8, Activations::Fp8] {
        let quantized = model.score(&tokens(120), &ScoreOptions { activations: mode, ..cpu }).unwrap();
        assert_ne!(quantized.nll_sum, fp16.nll_sum, "{mode:?} changed nothing");
        assert!((quantized.perplexity / fp16.perplexity - 1.0).abs() < 0.05, "{mode:?}");
        let options = CompareOptions { backend: Backend::Cpu, activations: mode, ..CompareOptions::default() };
        let result = model.compare(&model, &tokens(120), &options).unwrap();
        assert!(result.kl_mean > 0.0 && result.kl_mean < 0.05, "{mode:?}: KL {}", result.kl_mean);
        assert!((result.perplexity_test - quantized.perplexity).abs() <= 1e-6 * quantized.perplexity);
        assert!((result.perplexity_reference - fp16.perplexity).abs() <= 1e-6 * fp16.perplexity);
    }
    // The CUDA backend declines quantized activations, or there is no device.
    let cuda = ScoreOptions { backend: Backend::Cuda, activations: Activations::Int8, ..ScoreOptions::default() };
    assert!(matches!(model.score(&tokens(20), &cuda), Err(Error::Unsupported(_) | Error::NoDevice(_))));
}
