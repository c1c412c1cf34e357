//! Every chart is drawn once and written twice: as SVG and as PNG beside it
//! (same stem). A drawing backend that forwards each primitive to both an
//! SVG backend and a pixel buffer keeps the two pictures the same picture,
//! without a second drawing pass or an SVG rasteriser.
//!
//! Text in the PNG is rasterised with a font compiled into the crate
//! (a subset of DejaVu Sans, `assets/fonts/`), so no system font is needed;
//! text in the SVG stays text, named `sans-serif`.

use std::error::Error as StdError;
use std::fmt;
use std::sync::OnceLock;

use plotters::prelude::{BitMapBackend, DrawingBackend, SVGBackend};
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingErrorKind,
};

use crate::error::{Error, Result};

/// DejaVu Sans (Latin, Greek, Cyrillic, punctuation, arrows, mathematical
/// operators and geometric shapes), under the Bitstream Vera licence in
/// `assets/fonts/LICENSE`.
const FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans-subset.ttf");

/// Makes the bundled font plotters' `sans-serif`. Plotters looks fonts up
/// by family name in a process-wide table, for text layout in both
/// backends, so this runs before any chart is drawn.
pub(super) fn register_font() -> Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let registered = *REGISTERED.get_or_init(|| {
        plotters::style::register_font("sans-serif", plotters::style::FontStyle::Normal, FONT)
            .is_ok()
    });
    if registered {
        Ok(())
    } else {
        Err(Error::InvalidArgument(
            "the bundled chart font does not parse".into(),
        ))
    }
}

/// Either backend's error, as text.
#[derive(Debug)]
pub(super) struct TeeError(String);

impl fmt::Display for TeeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl StdError for TeeError {}

fn tee_error<E: StdError + Send + Sync>(e: DrawingErrorKind<E>) -> DrawingErrorKind<TeeError> {
    match e {
        DrawingErrorKind::DrawingError(e) => {
            DrawingErrorKind::DrawingError(TeeError(e.to_string()))
        }
        DrawingErrorKind::FontError(e) => DrawingErrorKind::FontError(e),
    }
}

/// Draws on an SVG and an RGB pixel buffer of the same size at once.
pub(super) struct Tee<'a> {
    svg: SVGBackend<'a>,
    bitmap: BitMapBackend<'a>,
}

impl<'a> Tee<'a> {
    /// `pixels` must hold 3 bytes per pixel of `size`.
    pub(super) fn new(svg: &'a mut String, pixels: &'a mut [u8], size: (u32, u32)) -> Result<Self> {
        let bitmap = BitMapBackend::with_buffer_and_format(pixels, size)
            .map_err(|e| Error::InvalidArgument(format!("a {}×{} chart: {e}", size.0, size.1)))?;
        Ok(Tee {
            svg: SVGBackend::with_string(svg, size),
            bitmap,
        })
    }
}

/// Runs one drawing call on both backends, the SVG's first.
macro_rules! both {
    ($self:ident, $b:ident => $call:expr) => {{
        {
            let $b = &mut $self.svg;
            $call.map_err(tee_error)?;
        }
        let $b = &mut $self.bitmap;
        $call.map_err(tee_error)
    }};
}

impl DrawingBackend for Tee<'_> {
    type ErrorType = TeeError;

    fn get_size(&self) -> (u32, u32) {
        self.svg.get_size()
    }

    fn ensure_prepared(&mut self) -> std::result::Result<(), DrawingErrorKind<TeeError>> {
        both!(self, b => b.ensure_prepared())
    }

    fn present(&mut self) -> std::result::Result<(), DrawingErrorKind<TeeError>> {
        both!(self, b => b.present())
    }

    fn draw_pixel(
        &mut self,
        point: BackendCoord,
        color: BackendColor,
    ) -> std::result::Result<(), DrawingErrorKind<TeeError>> {
        both!(self, b => b.draw_pixel(point, color))
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> std::result::Result<(), DrawingErrorKind<TeeError>> {
        both!(self, b => b.draw_line(from, to, style))
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> std::result::Result<(), DrawingErrorKind<TeeError>> {
        both!(self, b => b.draw_rect(upper_left, bottom_right, style, fill))
    }

    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> std::result::Result<(), DrawingErrorKind<TeeError>> {
        // The points are consumed once per backend.
        let path: Vec<BackendCoord> = path.into_iter().collect();
        both!(self, b => b.draw_path(path.iter().copied(), style))
    }

    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> std::result::Result<(), DrawingErrorKind<TeeError>> {
        both!(self, b => b.draw_circle(center, radius, style, fill))
    }

    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> std::result::Result<(), DrawingErrorKind<TeeError>> {
        let vert: Vec<BackendCoord> = vert.into_iter().collect();
        both!(self, b => b.fill_polygon(vert.iter().copied(), style))
    }

    fn draw_text<T: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &T,
        pos: BackendCoord,
    ) -> std::result::Result<(), DrawingErrorKind<TeeError>> {
        both!(self, b => b.draw_text(text, style, pos))
    }

    fn estimate_text_size<T: BackendTextStyle>(
        &self,
        text: &str,
        style: &T,
    ) -> std::result::Result<(u32, u32), DrawingErrorKind<TeeError>> {
        // Layout follows the font the PNG is drawn with, so labels placed
        // by their size fit in the picture with pixels; SVG viewers render
        // `sans-serif` with metrics close to it.
        self.bitmap
            .estimate_text_size(text, style)
            .map_err(tee_error)
    }

    fn blit_bitmap(
        &mut self,
        pos: BackendCoord,
        size: (u32, u32),
        src: &[u8],
    ) -> std::result::Result<(), DrawingErrorKind<TeeError>> {
        both!(self, b => b.blit_bitmap(pos, size, src))
    }
}

/// An RGB pixel buffer of `size` as PNG file contents.
pub(super) fn encode_png(pixels: &[u8], size: (u32, u32)) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    let mut encoder = png::Encoder::new(&mut bytes, size.0, size.1);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    // Charts are flat colour: per-row filters and the strongest deflate make
    // them several times smaller, for milliseconds more.
    encoder.set_adaptive_filter(png::AdaptiveFilterType::Adaptive);
    encoder.set_compression(png::Compression::Best);
    encoder
        .write_header()
        .and_then(|mut writer| writer.write_image_data(pixels))
        .map_err(|e| Error::InvalidArgument(format!("encoding a PNG chart: {e}")))?;
    Ok(bytes)
}
