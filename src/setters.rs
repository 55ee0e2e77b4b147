//! [`setters!`](crate::setters): the builder-style `with_*` methods of option and config
//! structs, written once.

/// `with_*` methods for public fields: `with_x(x: T)` sets field `x` (or, written
/// `x: Some(T)`, sets it to `Some(x)`; `x: Some(impl Into<T>)`, to `Some(x.into())`) and
/// returns `self`, documented as "Sets `x`" (linked to the field).
///
/// ```
/// #[derive(Default)]
/// pub struct Options {
///     /// Causal attention.
///     pub is_causal: bool,
///     /// An additive mask.
///     pub mask: Option<Vec<f32>>,
///     /// A title.
///     pub title: Option<String>,
/// }
/// candle_mha::setters! {
///     Options {
///         with_is_causal(is_causal: bool);
///         with_mask(mask: Some(Vec<f32>));
///         with_title(title: Some(impl Into<String>));
///     }
/// }
/// let o = Options::default().with_is_causal(true).with_mask(vec![0.0]).with_title("heads");
/// assert!(o.is_causal && o.mask.is_some() && o.title.as_deref() == Some("heads"));
/// ```
///
/// PyTorch equivalent: none (keyword arguments).
#[macro_export]
macro_rules! setters {
    ($ty:ty { $($setter:ident($field:ident : $($t:tt)+);)* }) => {
        impl $ty {
            $($crate::setters!(@one $setter $field $($t)+);)*
        }
    };
    (@one $setter:ident $field:ident Some(impl Into<$t:ty>)) => {
        #[doc = concat!("Sets [`", stringify!($field), "`](Self::", stringify!($field), ").")]
        pub fn $setter(mut self, $field: impl Into<$t>) -> Self {
            self.$field = Some($field.into());
            self
        }
    };
    (@one $setter:ident $field:ident Some($t:ty)) => {
        #[doc = concat!("Sets [`", stringify!($field), "`](Self::", stringify!($field), ").")]
        pub fn $setter(mut self, $field: $t) -> Self {
            self.$field = Some($field);
            self
        }
    };
    (@one $setter:ident $field:ident $t:ty) => {
        #[doc = concat!("Sets [`", stringify!($field), "`](Self::", stringify!($field), ").")]
        pub fn $setter(mut self, $field: $t) -> Self {
            self.$field = $field;
            self
        }
    };
}
