//! Times CPU scoring: loads a model and scores a fixed token sequence on the CPU backend, a few times, printing
//! the best and median wall time and tokens/s, plus the linked library's build info (so a run says which build
//! of the C++ it measured: `"build_type":"cargo -O3 -DNDEBUG"` from the crate, `"Release"` from CMake).
//!
//! ```text
//! cargo run --release --example score_time -- [MODEL] [TOKENS] [THREADS] [REPEATS]
//! ```
//!
//! Defaults: `models/demo-int4.tinyloop` (else `tests/data/tiny.tinyloop`), 512 tokens, 1 thread, 5 repeats.
//! Tokens are `i * 7 % vocab`, the same every run.

use std::path::PathBuf;
use std::time::Instant;

use tinyloop::{Backend, Model, ScoreOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let model_path = match args.first() {
        Some(path) => PathBuf::from(path),
        None => {
            let demo = repo.join("models/demo-int4.tinyloop");
            if demo.is_file() {
                demo
            } else {
                repo.join("tests/data/tiny.tinyloop")
            }
        }
    };
    let parse = |index: usize, default: usize| -> Result<usize, Box<dyn std::error::Error>> {
        Ok(match args.get(index) {
            Some(text) => text.parse().map_err(|e| format!("argument {}: {text:?}: {e}", index + 1))?,
            None => default,
        })
    };
    let (n_tokens, threads, repeats) = (parse(1, 512)?, parse(2, 1)?, parse(3, 5)?.max(1));

    let model = Model::load(&model_path)?;
    let info = model.info();
    let tokens: Vec<i32> = (0..n_tokens).map(|i| (i * 7 % info.vocab) as i32).collect();
    let options = ScoreOptions { backend: Backend::Cpu, threads, ..ScoreOptions::default() };
    println!("library {} build {}", tinyloop::version(), tinyloop::build_info().split_whitespace().collect::<String>());
    println!("model {} ({} tokens, {threads} thread(s), {repeats} runs)", model_path.display(), tokens.len());

    let mut times = Vec::with_capacity(repeats);
    let mut perplexity = 0.0;
    for _ in 0..repeats {
        let start = Instant::now();
        let result = model.score(&tokens, &options)?;
        times.push(start.elapsed().as_secs_f64());
        perplexity = result.perplexity;
    }
    times.sort_by(f64::total_cmp);
    let (best, median) = (times[0], times[times.len() / 2]);
    println!(
        "perplexity {perplexity:.4}; best {:.1} ms, median {:.1} ms ({:.0} tokens/s at the best)",
        best * 1e3,
        median * 1e3,
        tokens.len() as f64 / best
    );
    Ok(())
}
