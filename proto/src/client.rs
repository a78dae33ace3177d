//! Dialling a CSI driver (or any gRPC server) on a unix socket.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use csiops_proto::client::{self, CsiClient};
//! use csiops_proto::csi::v1::GetPluginInfoRequest;
//!
//! let channel = client::connect("unix:///csi/csi.sock", Duration::from_secs(10)).await?;
//! let csi = CsiClient::new(channel, Duration::from_secs(15));
//! // Gets the default 15 s deadline, counted from this call:
//! let _info = csi.identity().get_plugin_info(GetPluginInfoRequest {}).await?;
//! // Overrides it for this call only:
//! let _info = csi
//!     .identity()
//!     .get_plugin_info(client::with_timeout(GetPluginInfoRequest {}, Duration::from_secs(1)))
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! # Deadlines
//!
//! Every call carries its own deadline, counted from when that call starts:
//! [`with_timeout`] sets it explicitly (the `grpc-timeout` header), and
//! [`CsiClient`] adds its default to any call that has none. The deadline is
//! enforced on our side and sent to the driver, which may enforce it too.
//! An expired deadline always surfaces as [`tonic::Code::DeadlineExceeded`]
//! (plain tonic reports a client-side expiry as `Cancelled`; [`CsiChannel`]
//! corrects that).
//!
//! # Reconnects
//!
//! [`connect`] dials eagerly, so a missing or dead socket is reported at once
//! with its path. Afterwards the channel reconnects lazily: a call made while
//! the driver is down fails with `Unavailable`, and the next call dials again.

use std::{
    error::Error as StdError,
    future::Future,
    io,
    path::{Path, PathBuf},
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::{
    body::Body,
    codegen::http,
    service::{interceptor::InterceptedService, Interceptor},
    transport::{Channel, Endpoint, Uri},
    Request, Status,
};

use crate::csi::v1::{
    controller_client::ControllerClient, group_controller_client::GroupControllerClient,
    identity_client::IdentityClient, node_client::NodeClient,
};

type BoxError = Box<dyn StdError + Send + Sync>;

/// Why [`connect`] failed. The messages name the socket path, e.g.
/// `cannot connect to CSI driver at /csi/csi.sock: No such file or directory`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The address is not a unix socket address we understand.
    #[error("invalid CSI address {address:?}: {reason}")]
    InvalidAddress {
        address: String,
        reason: &'static str,
    },
    /// Dialling the socket failed (missing file, nobody listening, ...).
    /// The I/O error is part of the message; match on `error.kind()`.
    #[error("cannot connect to CSI driver at {}: {}", path.display(), io_message(error))]
    Io { path: PathBuf, error: io::Error },
    /// The socket accepted but no gRPC connection was up within the timeout.
    #[error("timed out after {timeout:?} connecting to CSI driver at {}", path.display())]
    Timeout { path: PathBuf, timeout: Duration },
    /// The gRPC (HTTP/2) connection could not be set up.
    #[error("cannot connect to CSI driver at {}: {}", path.display(), error_chain(error))]
    Transport {
        path: PathBuf,
        error: tonic::transport::Error,
    },
}

impl ConnectError {
    /// The socket path, unless the address itself was invalid.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Self::InvalidAddress { .. } => None,
            Self::Io { path, .. } | Self::Timeout { path, .. } | Self::Transport { path, .. } => {
                Some(path)
            }
        }
    }
}

/// Turns a CSI address into a socket path. Accepted forms:
/// `unix:///abs/path`, `unix:/abs/path`, `unix:rel/path` and a plain path.
/// Other schemes (`tcp://`, `dns:`, ...) are rejected.
pub fn socket_path(address: &str) -> Result<PathBuf, ConnectError> {
    let invalid = |reason| ConnectError::InvalidAddress {
        address: address.to_owned(),
        reason,
    };
    let path = if let Some(rest) = address.strip_prefix("unix://") {
        if !rest.starts_with('/') {
            return Err(invalid(
                "unix:// needs an absolute path, e.g. unix:///csi/csi.sock",
            ));
        }
        rest
    } else if let Some(rest) = address.strip_prefix("unix:") {
        rest
    } else if address.contains("://") {
        return Err(invalid("only unix sockets are supported"));
    } else {
        address
    };
    if path.is_empty() {
        return Err(invalid("empty socket path"));
    }
    Ok(PathBuf::from(path))
}

/// Dials the unix socket at `address` (see [`socket_path`] for the forms)
/// and waits up to `timeout` for the gRPC connection to be up.
///
/// The returned channel is cheap to clone and reconnects lazily if the
/// driver restarts. `timeout` also bounds each later reconnect attempt; it
/// does not limit calls (see the module docs on deadlines).
pub async fn connect(address: &str, timeout: Duration) -> Result<CsiChannel, ConnectError> {
    let path = socket_path(address)?;
    tracing::debug!(path = %path.display(), "connecting to CSI driver");

    let dial_path = path.clone();
    let connector = tower::service_fn(move |_: Uri| {
        let path = dial_path.clone();
        async move { UnixStream::connect(path).await.map(TokioIo::new) }
    });
    // The URI is a placeholder: the connector ignores it; it only supplies
    // the `:authority` ("localhost", as other gRPC clients use for unix sockets).
    let endpoint = Endpoint::from_static("http://localhost").connect_timeout(timeout);

    match tokio::time::timeout(timeout, endpoint.connect_with_connector(connector)).await {
        Ok(Ok(inner)) => {
            tracing::debug!(path = %path.display(), "connected to CSI driver");
            Ok(CsiChannel {
                inner,
                path: Arc::new(path),
            })
        }
        Ok(Err(error)) => Err(classify(path, timeout, error)),
        Err(_elapsed) => Err(ConnectError::Timeout { path, timeout }),
    }
}

fn classify(path: PathBuf, timeout: Duration, error: tonic::transport::Error) -> ConnectError {
    if let Some(io) = find::<io::Error>(&error) {
        // Keep kind and OS error code; the boxed chain itself is not Clone.
        let error = match io.raw_os_error() {
            Some(code) => io::Error::from_raw_os_error(code),
            None => io::Error::new(io.kind(), io.to_string()),
        };
        return ConnectError::Io { path, error };
    }
    if find::<tonic::TimeoutExpired>(&error).is_some()
        || find::<tokio::time::error::Elapsed>(&error).is_some()
    {
        return ConnectError::Timeout { path, timeout };
    }
    ConnectError::Transport { path, error }
}

/// `io::Error`'s message without the trailing " (os error N)".
fn io_message(error: &io::Error) -> String {
    let text = error.to_string();
    match text.rfind(" (os error ") {
        Some(at) if text.ends_with(')') => text[..at].to_owned(),
        _ => text,
    }
}

fn error_chain(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(err) = source {
        text.push_str(": ");
        text.push_str(&err.to_string());
        source = err.source();
    }
    text
}

/// Wraps `message` in a request whose deadline is `timeout` from when the
/// call starts.
pub fn with_timeout<T>(message: T, timeout: Duration) -> Request<T> {
    let mut request = Request::new(message);
    request.set_timeout(timeout);
    request
}

/// A connected gRPC channel (from [`connect`]) usable with any generated
/// client, e.g. `IdentityClient::new(channel)`. Cheap to clone; clones share
/// the connection.
///
/// Same as [`tonic::transport::Channel`], except for clearer errors:
/// - a call whose deadline expires fails with `DeadlineExceeded` (tonic
///   alone says `Cancelled`);
/// - a call made while the driver is unreachable, or whose connection
///   breaks, fails with `Unavailable` (tonic: often `Unknown`) and a message
///   naming the socket, e.g. `cannot connect to CSI driver at
///   /csi/csi.sock: No such file or directory`.
#[derive(Clone, Debug)]
pub struct CsiChannel {
    inner: Channel,
    path: Arc<PathBuf>,
}

impl CsiChannel {
    /// The socket this channel dials.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The underlying tonic channel, without the error mapping above.
    pub fn into_inner(self) -> Channel {
        self.inner
    }

    fn map_error(&self) -> impl FnOnce(tonic::transport::Error) -> BoxError {
        let path = Arc::clone(&self.path);
        move |error| {
            if let Some(connect) = find::<tonic::ConnectError>(&error) {
                let reason = match find::<io::Error>(connect) {
                    Some(io) => io_message(io),
                    None => error_chain(connect),
                };
                let message = format!(
                    "cannot connect to CSI driver at {}: {reason}",
                    path.display()
                );
                return Box::new(Status::unavailable(message));
            }
            if find::<tonic::TimeoutExpired>(&error).is_some() {
                return Box::new(Status::deadline_exceeded("deadline exceeded"));
            }
            // Everything else here is a failure of the connection itself
            // (server statuses never take this path). tonic maps HTTP/2
            // resets to their gRPC codes and the rest (broken pipe, EOF, ...)
            // to Unknown; gRPC calls those Unavailable.
            let detail = error_chain(&error);
            let status = Status::from_error(error.into());
            if status.code() != tonic::Code::Unknown {
                return Box::new(status);
            }
            let message = format!(
                "connection to CSI driver at {} failed: {detail}",
                path.display()
            );
            Box::new(Status::unavailable(message))
        }
    }
}

impl tower::Service<http::Request<Body>> for CsiChannel {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future =
        Pin<Box<dyn Future<Output = Result<http::Response<Body>, BoxError>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        tower::Service::poll_ready(&mut self.inner, cx).map_err(self.map_error())
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let map_error = self.map_error();
        let response = tower::Service::call(&mut self.inner, request);
        Box::pin(async move { response.await.map_err(map_error) })
    }
}

/// The first error of type `E` in `error`'s source chain (itself included).
fn find<'a, E: StdError + 'static>(error: &'a (dyn StdError + 'static)) -> Option<&'a E> {
    let mut source = Some(error);
    while let Some(err) = source {
        if let Some(found) = err.downcast_ref::<E>() {
            return Some(found);
        }
        source = err.source();
    }
    None
}

/// Interceptor that gives every call without a deadline the default one.
#[derive(Clone, Copy, Debug)]
pub struct DefaultDeadline(pub Duration);

impl Interceptor for DefaultDeadline {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if !request.metadata().contains_key("grpc-timeout") {
            request.set_timeout(self.0);
        }
        Ok(request)
    }
}

/// The transport used by [`CsiClient`]'s clients.
pub type DeadlineChannel = InterceptedService<CsiChannel, DefaultDeadline>;

/// A channel to one CSI driver plus a default per-call timeout.
///
/// The accessors are cheap (they clone the channel); each call made through
/// them gets `default_timeout` as its deadline unless the request already
/// has one (see [`with_timeout`]).
#[derive(Clone, Debug)]
pub struct CsiClient {
    channel: CsiChannel,
    default_timeout: Duration,
}

impl CsiClient {
    pub fn new(channel: CsiChannel, default_timeout: Duration) -> Self {
        Self {
            channel,
            default_timeout,
        }
    }

    /// [`connect`]s to `address` (using `timeout` for the dial too) and
    /// uses `timeout` as the default per-call deadline.
    pub async fn connect(address: &str, timeout: Duration) -> Result<Self, ConnectError> {
        Ok(Self::new(connect(address, timeout).await?, timeout))
    }

    pub fn channel(&self) -> &CsiChannel {
        &self.channel
    }

    pub fn default_timeout(&self) -> Duration {
        self.default_timeout
    }

    fn transport(&self) -> DeadlineChannel {
        InterceptedService::new(self.channel.clone(), DefaultDeadline(self.default_timeout))
    }

    pub fn identity(&self) -> IdentityClient<DeadlineChannel> {
        IdentityClient::new(self.transport())
    }

    pub fn controller(&self) -> ControllerClient<DeadlineChannel> {
        ControllerClient::new(self.transport())
    }

    pub fn node(&self) -> NodeClient<DeadlineChannel> {
        NodeClient::new(self.transport())
    }

    pub fn group_controller(&self) -> GroupControllerClient<DeadlineChannel> {
        GroupControllerClient::new(self.transport())
    }
}
