//! The pipe protocol between the pool and a worker: frames, and what their headers say.
//!
//! A frame is `b"HIW1"`, the header's length (u32 LE), the body's length (u64 LE), the header
//! (JSON), then the body (raw bytes: the document one way, the Markdown the other). Both
//! lengths are checked against the reader's maximum before anything is allocated for them.

use std::io::{self, Read, Write};
use std::time::Duration;

use hearth_markdown::{Attachments, Format, Languages, Limits, Ocr, Options};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::error::ConvertErrorKind;

/// Every frame starts with these bytes (the protocol's name and version).
pub(crate) const MAGIC: [u8; 4] = *b"HIW1";
/// The longest header either side accepts: room for the warnings of a large archive.
pub(crate) const MAX_HEADER_BYTES: u32 = 4 * 1024 * 1024;
/// Bytes a body may have beyond its limit (the converter's "output cut" note).
pub(crate) const BODY_SLACK_BYTES: u64 = 64 * 1024;
/// The environment variable that carries a worker's [`WorkerConfig`] (JSON).
pub(crate) const CONFIG_ENV: &str = "HEARTH_CONVERT_WORKER";

const PREFIX_BYTES: usize = 16;

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FrameError {
    /// The pipe closed before a whole frame came: the other side is gone.
    #[error("the pipe closed")]
    Closed,
    #[error("reading the pipe failed: {0}")]
    Io(#[from] io::Error),
    #[error("a frame started with {0:02x?} instead of the protocol's magic")]
    BadMagic([u8; 4]),
    #[error("a frame's header claims {len} bytes; the limit is {max}")]
    HeaderTooLarge { len: u32, max: u32 },
    #[error("a frame's body claims {len} bytes; the limit is {max}")]
    BodyTooLarge { len: u64, max: u64 },
    #[error("a frame's header is not valid: {0}")]
    Header(#[from] serde_json::Error),
}

impl FrameError {
    /// Whether the error means the peer is gone (as against the peer having said nonsense).
    pub(crate) fn is_closed(&self) -> bool {
        match self {
            FrameError::Closed => true,
            FrameError::Io(e) => matches!(
                e.kind(),
                io::ErrorKind::BrokenPipe
                    | io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::ConnectionReset
            ),
            _ => false,
        }
    }
}

fn prefix(header_len: usize, body_len: usize) -> io::Result<[u8; PREFIX_BYTES]> {
    let header_len = u32::try_from(header_len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "header too long"))?;
    let mut p = [0u8; PREFIX_BYTES];
    p[..4].copy_from_slice(&MAGIC);
    p[4..8].copy_from_slice(&header_len.to_le_bytes());
    p[8..].copy_from_slice(&(body_len as u64).to_le_bytes());
    Ok(p)
}

/// Checks a frame's prefix; returns the header and body lengths.
fn parse_prefix(p: &[u8; PREFIX_BYTES], max_body: u64) -> Result<(usize, usize), FrameError> {
    let magic: [u8; 4] = [p[0], p[1], p[2], p[3]];
    if magic != MAGIC {
        return Err(FrameError::BadMagic(magic));
    }
    let header_len = u32::from_le_bytes([p[4], p[5], p[6], p[7]]);
    if header_len > MAX_HEADER_BYTES {
        return Err(FrameError::HeaderTooLarge {
            len: header_len,
            max: MAX_HEADER_BYTES,
        });
    }
    let body_len = u64::from_le_bytes([p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15]]);
    if body_len > max_body {
        return Err(FrameError::BodyTooLarge {
            len: body_len,
            max: max_body,
        });
    }
    // Both fit in memory's address range: the limits above are far below usize::MAX.
    Ok((header_len as usize, body_len as usize))
}

/// Writes one frame (blocking; the worker's side).
pub(crate) fn write_frame<H: Serialize>(
    out: &mut impl Write,
    header: &H,
    body: &[u8],
) -> io::Result<()> {
    let header = serde_json::to_vec(header)?;
    out.write_all(&prefix(header.len(), body.len())?)?;
    out.write_all(&header)?;
    out.write_all(body)?;
    out.flush()
}

/// Reads one frame (blocking; the worker's side). `Ok(None)`: the pipe closed between frames.
pub(crate) fn read_frame<H: for<'de> Deserialize<'de>>(
    input: &mut impl Read,
    max_body: u64,
) -> Result<Option<(H, Vec<u8>)>, FrameError> {
    let mut p = [0u8; PREFIX_BYTES];
    let mut got = 0;
    while got < PREFIX_BYTES {
        match input.read(&mut p[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(FrameError::Closed),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let (header_len, body_len) = parse_prefix(&p, max_body)?;
    let mut header = vec![0u8; header_len];
    input.read_exact(&mut header)?;
    let mut body = vec![0u8; body_len];
    input.read_exact(&mut body)?;
    Ok(Some((serde_json::from_slice(&header)?, body)))
}

/// Writes one frame (async; the pool's side).
pub(crate) async fn send_frame<H: Serialize>(
    out: &mut (impl AsyncWrite + Unpin),
    header: &H,
    body: &[u8],
) -> Result<(), FrameError> {
    let header = serde_json::to_vec(header)?;
    out.write_all(&prefix(header.len(), body.len())?).await?;
    out.write_all(&header).await?;
    out.write_all(body).await?;
    out.flush().await?;
    Ok(())
}

/// Reads one frame (async; the pool's side). A pipe closed anywhere is [`FrameError::Closed`].
pub(crate) async fn recv_frame<H: for<'de> Deserialize<'de>>(
    input: &mut (impl AsyncRead + Unpin),
    max_body: u64,
) -> Result<(H, Vec<u8>), FrameError> {
    let closed = |e: io::Error| match e.kind() {
        io::ErrorKind::UnexpectedEof => FrameError::Closed,
        _ => FrameError::Io(e),
    };
    let mut p = [0u8; PREFIX_BYTES];
    input.read_exact(&mut p).await.map_err(closed)?;
    let (header_len, body_len) = parse_prefix(&p, max_body)?;
    let mut header = vec![0u8; header_len];
    input.read_exact(&mut header).await.map_err(closed)?;
    let mut body = vec![0u8; body_len];
    input.read_exact(&mut body).await.map_err(closed)?;
    Ok((serde_json::from_slice(&header)?, body))
}

/// What the pool tells a worker at start (in [`CONFIG_ENV`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct WorkerConfig {
    /// Address space the worker may add to what it has mapped when it starts.
    pub memory_limit_bytes: u64,
    /// The largest document body the worker accepts.
    pub max_request_bytes: u64,
}

/// One conversion job (the body is the document).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Request {
    pub filename: Option<String>,
    /// The converter's [`Options`], by the names their own `FromStr` reads.
    #[serde(flatten)]
    pub options: WireOptions,
    pub limits: WireLimits,
    /// CPU seconds this job may use (the worker's RLIMIT_CPU is moved to used + this).
    pub cpu_seconds: u64,
}

/// What a worker says: once when ready, then once per job.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum Reply {
    /// Limits set, waiting for jobs. `address_space_bytes`: its RLIMIT_AS.
    Ready {
        pid: u32,
        address_space_bytes: u64,
        usage: Usage,
    },
    /// The job converted; the body is the Markdown (UTF-8).
    Converted {
        format: String,
        warnings: Vec<String>,
        usage: Usage,
    },
    /// The converter refused or failed the document.
    Failed {
        kind: ConvertErrorKind,
        message: String,
        usage: Usage,
    },
}

/// The worker's resource use so far (`getrusage(RUSAGE_SELF)`).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub(crate) struct Usage {
    /// Peak resident set size.
    pub max_rss_bytes: u64,
    /// User plus system CPU time.
    pub cpu_ms: u64,
}

/// [`Limits`] as they cross the pipe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WireLimits {
    pub max_input_bytes: u64,
    pub max_unpacked_bytes: u64,
    pub max_members: usize,
    pub max_depth: usize,
    pub max_xml_depth: usize,
    pub time_limit_ms: u64,
    pub max_output_bytes: usize,
    pub max_table_rows: usize,
}

impl From<&Limits> for WireLimits {
    fn from(l: &Limits) -> Self {
        WireLimits {
            max_input_bytes: l.max_input_bytes,
            max_unpacked_bytes: l.max_unpacked_bytes,
            max_members: l.max_members,
            max_depth: l.max_depth,
            max_xml_depth: l.max_xml_depth,
            time_limit_ms: u64::try_from(l.time_limit.as_millis()).unwrap_or(u64::MAX),
            max_output_bytes: l.max_output_bytes,
            max_table_rows: l.max_table_rows,
        }
    }
}

impl From<&WireLimits> for Limits {
    #[allow(clippy::needless_update)]
    fn from(w: &WireLimits) -> Self {
        Limits {
            max_input_bytes: w.max_input_bytes,
            max_unpacked_bytes: w.max_unpacked_bytes,
            max_members: w.max_members,
            max_depth: w.max_depth,
            max_xml_depth: w.max_xml_depth,
            time_limit: Duration::from_millis(w.time_limit_ms),
            max_output_bytes: w.max_output_bytes,
            max_table_rows: w.max_table_rows,
            // Limits the wire does not know yet keep their defaults.
            ..Limits::default()
        }
    }
}

/// [`Options`] as they cross the pipe: each by the name its `FromStr` reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WireOptions {
    pub attachments: String,
    pub ocr: String,
    /// `None`: the library chooses per page.
    pub languages: Option<String>,
}

impl From<&Options> for WireOptions {
    fn from(o: &Options) -> Self {
        WireOptions {
            attachments: attachments_name(o.attachments).to_owned(),
            ocr: o.ocr.name().to_owned(),
            languages: o.languages.as_ref().map(|l| l.as_str().to_owned()),
        }
    }
}

impl TryFrom<&WireOptions> for Options {
    /// The parser's own message for the first value it does not know.
    type Error = String;
    fn try_from(w: &WireOptions) -> Result<Self, String> {
        Ok(Options {
            attachments: w.attachments.parse::<Attachments>()?,
            ocr: w.ocr.parse::<Ocr>()?,
            languages: w
                .languages
                .as_deref()
                .map(str::parse::<Languages>)
                .transpose()?,
        })
    }
}

/// The name of `a` on the wire (what `Attachments::from_str` parses).
pub(crate) fn attachments_name(a: Attachments) -> &'static str {
    match a {
        Attachments::List => "list",
        Attachments::Convert => "convert",
    }
}

/// Every format, to find one by its [`Format::name`].
const FORMATS: [Format; 21] = [
    Format::Pdf,
    Format::Docx,
    Format::Pptx,
    Format::Xlsx,
    Format::Xls,
    Format::Ods,
    Format::Odt,
    Format::Epub,
    Format::Zip,
    Format::Msg,
    Format::Eml,
    Format::Rtf,
    Format::Html,
    Format::Xml,
    Format::Json,
    Format::Ipynb,
    Format::Csv,
    Format::Tsv,
    Format::Markdown,
    Format::Text,
    Format::Image,
];

/// The format named `name` by [`Format::name`].
pub(crate) fn format_named(name: &str) -> Option<Format> {
    FORMATS.into_iter().find(|f| f.name() == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fails to compile when the library gains a format that [`FORMATS`] lacks.
    #[test]
    fn every_format_is_found_by_its_name() {
        for f in FORMATS {
            match f {
                Format::Pdf
                | Format::Docx
                | Format::Pptx
                | Format::Xlsx
                | Format::Xls
                | Format::Ods
                | Format::Odt
                | Format::Epub
                | Format::Zip
                | Format::Msg
                | Format::Eml
                | Format::Rtf
                | Format::Html
                | Format::Xml
                | Format::Json
                | Format::Ipynb
                | Format::Csv
                | Format::Tsv
                | Format::Markdown
                | Format::Text
                | Format::Image => assert_eq!(format_named(f.name()), Some(f)),
            }
        }
        assert_eq!(format_named("doc"), None);
    }

    #[test]
    fn attachments_names_parse_back() {
        for a in [Attachments::List, Attachments::Convert] {
            assert_eq!(attachments_name(a).parse::<Attachments>(), Ok(a));
        }
    }

    #[test]
    fn options_round_trip_the_wire_and_bad_names_are_refused() {
        let languages = "eng+fra".parse::<Languages>().unwrap();
        for options in [
            Options::default(),
            Options {
                attachments: Attachments::Convert,
                ocr: Ocr::Force,
                languages: Some(languages),
            },
            Options {
                ocr: Ocr::Off,
                ..Options::default()
            },
        ] {
            let wire = WireOptions::from(&options);
            assert_eq!(Options::try_from(&wire), Ok(options));
        }
        let bad = |f: fn(&mut WireOptions)| {
            let mut wire = WireOptions::from(&Options::default());
            f(&mut wire);
            Options::try_from(&wire).unwrap_err()
        };
        assert!(bad(|w| w.attachments = "all".into()).contains("attachments must be"));
        assert!(bad(|w| w.ocr = "always".into()).contains("ocr must be"));
        assert!(bad(|w| w.languages = Some("../x".into())).contains("lang must be"));
    }

    #[test]
    fn a_frame_round_trips_with_raw_bytes() {
        let mut pipe = Vec::new();
        let usage = Usage::default();
        write_frame(
            &mut pipe,
            &Reply::Ready {
                pid: 7,
                address_space_bytes: 1,
                usage,
            },
            b"\0\xff",
        )
        .unwrap();
        let (reply, body): (Reply, Vec<u8>) = read_frame(&mut pipe.as_slice(), 2).unwrap().unwrap();
        assert!(matches!(reply, Reply::Ready { pid: 7, .. }));
        assert_eq!(body, b"\0\xff");
        // Between frames, a closed pipe is the end; inside one, it is an error.
        assert!(read_frame::<Reply>(&mut &[][..], 2).unwrap().is_none());
        assert!(matches!(
            read_frame::<Reply>(&mut &pipe[..20], 2),
            Err(FrameError::Io(_))
        ));
    }

    /// A prefix claiming a terabyte fails before anything is allocated for it: were it
    /// allocated, this test would abort.
    #[test]
    fn oversize_frames_are_refused_before_allocation() {
        let mut huge = Vec::from(MAGIC);
        huge.extend_from_slice(&2u32.to_le_bytes());
        huge.extend_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(matches!(
            read_frame::<Reply>(&mut huge.as_slice(), 1 << 20),
            Err(FrameError::BodyTooLarge { len, .. }) if len == 1 << 40
        ));
        let mut header = Vec::from(MAGIC);
        header.extend_from_slice(&u32::MAX.to_le_bytes());
        header.extend_from_slice(&0u64.to_le_bytes());
        assert!(matches!(
            read_frame::<Reply>(&mut header.as_slice(), 1 << 20),
            Err(FrameError::HeaderTooLarge { .. })
        ));
        let garbage = *b"hello, world! this is not a frame";
        assert!(matches!(
            read_frame::<Reply>(&mut &garbage[..], 1 << 20),
            Err(FrameError::BadMagic(_))
        ));
    }

    #[tokio::test]
    async fn the_async_side_refuses_oversize_frames_too() {
        let mut huge = Vec::from(MAGIC);
        huge.extend_from_slice(&2u32.to_le_bytes());
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        let got = recv_frame::<Reply>(&mut huge.as_slice(), 1 << 20).await;
        assert!(matches!(got, Err(FrameError::BodyTooLarge { .. })));
        let mut pipe = Vec::new();
        let request = Request {
            filename: Some("a.csv".into()),
            options: WireOptions::from(&Options::default()),
            limits: WireLimits::from(&Limits::default()),
            cpu_seconds: 3,
        };
        send_frame(&mut pipe, &request, b"a,b\n1,2\n")
            .await
            .unwrap();
        let (back, body): (Request, Vec<u8>) = recv_frame(&mut pipe.as_slice(), 8).await.unwrap();
        assert_eq!(back.limits, request.limits);
        assert_eq!(back.options, request.options);
        assert_eq!(body, b"a,b\n1,2\n");
        let cut = &pipe[..pipe.len() - 1];
        let got = recv_frame::<Request>(&mut &cut[..], 8).await;
        assert!(matches!(got, Err(FrameError::Closed)));
    }
}
