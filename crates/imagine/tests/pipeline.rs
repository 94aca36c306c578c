//! The whole pipeline and its worker on the tiny model: seeded determinism, sizes, guidance,
//! cancellation and the bounded queue.

use candle_core::{DType, Device};
use hearth_imagine::tiny::TINY_SEED;
use hearth_imagine::{write_tiny_sdxl, Error, ImageParams, ImageWorker, ModelFiles, SdxlPipeline};

fn pipeline() -> (tempfile::TempDir, SdxlPipeline) {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_sdxl(dir.path(), TINY_SEED).unwrap();
    let files = ModelFiles::from_dir(dir.path(), None).unwrap();
    let p = SdxlPipeline::load(&files, &Device::Cpu, DType::F32).unwrap();
    (dir, p)
}

fn params(seed: u64, width: usize, height: usize) -> ImageParams {
    ImageParams {
        prompt: "a castle in the forest".into(),
        negative_prompt: String::new(),
        seed,
        steps: 2,
        width,
        height,
        guidance_scale: 2.0,
        init: None,
        loras: Vec::new(),
    }
}

fn png_size(png: &[u8]) -> (u32, u32) {
    let img = image::load_from_memory_with_format(png, image::ImageFormat::Png).unwrap();
    (img.width(), img.height())
}

#[test]
fn same_seed_same_bytes_other_seed_other_image_and_requested_size() {
    let (_d, p) = pipeline();
    let a = p.generate(&params(5, 192, 128), &|| false).unwrap();
    let b = p.generate(&params(5, 192, 128), &|| false).unwrap();
    let c = p.generate(&params(6, 192, 128), &|| false).unwrap();
    assert_eq!((a.width, a.height), (192, 128));
    assert_eq!(a.rgb.len(), 192 * 128 * 3);
    assert_eq!(a.to_png().unwrap(), b.to_png().unwrap());
    assert_ne!(a.rgb, c.rgb);
    assert_eq!(png_size(&a.to_png().unwrap()), (192, 128));
    // Not a flat picture: the decoder output varies across pixels.
    let distinct: std::collections::HashSet<_> = a.rgb.chunks(3).collect();
    assert!(distinct.len() > 100, "{} distinct colours", distinct.len());
}

#[test]
fn initial_noise_depends_only_on_the_seed_and_is_standard_normal() {
    let (_d, p) = pipeline();
    let a = p.initial_noise(11, 512, 512).unwrap();
    let b = p.initial_noise(11, 512, 512).unwrap();
    assert_eq!(a.dims(), &[1, 4, 64, 64]);
    let (va, vb) = (
        a.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        b.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
    );
    assert_eq!(va, vb);
    let n = va.len() as f64;
    let mean = va.iter().map(|&x| x as f64).sum::<f64>() / n;
    let var = va.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
    assert!(
        mean.abs() < 0.03 && (var - 1.0).abs() < 0.05,
        "mean {mean} var {var}"
    );
}

#[test]
fn a_negative_prompt_turns_on_guidance_and_changes_the_image() {
    let (_d, p) = pipeline();
    let plain = p.generate(&params(1, 128, 128), &|| false).unwrap();
    let mut guided = params(1, 128, 128);
    guided.negative_prompt = "blurry".into();
    assert!(guided.uses_guidance());
    let g = p.generate(&guided, &|| false).unwrap();
    assert_ne!(plain.rgb, g.rgb);
}

#[test]
fn a_stop_request_cancels_between_steps() {
    let (_d, p) = pipeline();
    let err = p.generate(&params(1, 128, 128), &|| true).unwrap_err();
    assert!(matches!(err, Error::Cancelled), "{err}");
}

#[test]
fn sizes_that_are_not_multiples_of_8_name_the_field() {
    let (_d, p) = pipeline();
    let err = p.generate(&params(1, 130, 128), &|| false).unwrap_err();
    assert!(
        matches!(err, Error::InvalidParams { field: "width", .. }),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_serves_in_turn_refuses_when_full_and_drops_abandoned_jobs() {
    let (_d, p) = pipeline();
    let worker = ImageWorker::spawn(p, 1, "test").unwrap();
    let small = worker.generate(params(2, 128, 128)).await.unwrap();
    assert_eq!(png_size(&small.png), (128, 128));

    // A long job runs, one waits, the third is refused at once.
    let big = |seed| {
        let mut prm = params(seed, 512, 512);
        prm.steps = 8;
        prm
    };
    let w1 = worker.clone();
    let first = tokio::spawn(async move { w1.generate(big(1)).await });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let w2 = worker.clone();
    let second = tokio::spawn(async move { w2.generate(big(2)).await });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let third = worker.generate(big(3)).await;
    assert!(matches!(third, Err(Error::Overloaded { .. })), "{third:?}");

    // Abandon both: the worker stops the running one before its next step and skips the queued
    // one when it reaches it (a queued job holds its slot until then), and is free again soon.
    first.abort();
    second.abort();
    let retry = async {
        loop {
            match worker.generate(params(3, 128, 128)).await {
                Err(Error::Overloaded { .. }) => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await
                }
                other => return other,
            }
        }
    };
    let after = tokio::time::timeout(std::time::Duration::from_secs(60), retry)
        .await
        .expect("worker freed by the abandoned jobs")
        .unwrap();
    assert_eq!(after.width, 128);
    assert!(worker.is_alive());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_times_every_denoising_step() {
    let (_d, p) = pipeline();
    let (tx, rx) = std::sync::mpsc::channel();
    let on_step = Box::new(move |d: std::time::Duration| tx.send(d).unwrap());
    let worker = ImageWorker::spawn_observed(p, 1, "test", on_step).unwrap();
    let mut prm = params(4, 128, 128);
    prm.steps = 3;
    let image = worker.generate(prm).await.unwrap();
    let steps: Vec<_> = rx.try_iter().collect();
    assert_eq!(steps.len(), 3, "one duration per step: {steps:?}");
    let total: f64 = steps.iter().map(|d| d.as_secs_f64()).sum();
    assert!(
        total > 0.0 && total <= image.seconds,
        "steps {total} s within the image's {} s",
        image.seconds
    );
}
