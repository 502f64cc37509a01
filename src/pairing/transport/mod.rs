//! The handshake over WebSocket: one JSON message per text frame, 64 KiB at most, every step
//! bounded in time. The gateway dials the tool host's pairing endpoint (`ws://` only to
//! loopback); the tool host serves that endpoint on its own port, never the tool port.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::handshake::HandshakeError;
/// Largest pairing message accepted (as crabstack: 64 KiB).
pub use super::wire::MAX_MESSAGE_BYTES;

mod endpoint;
pub use endpoint::{PairingEndpoint, PairingSink};
mod dial;
pub use dial::{pair, parse_endpoint, Completed, Ending, Endpoint, RecordPeer};
#[cfg(test)]
mod tests;

/// Longest wait for the peer's next message.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest whole handshake, gateway side.
pub const PAIR_TIMEOUT: Duration = Duration::from_secs(15);
/// Pairing connections served at once by a tool host (the rest are closed at accept). Only
/// one of them pairs at a time; the others wait for their first message or are refused.
pub const MAX_PAIRING_CONNECTIONS: usize = 16;
/// Of those, what one address (an IPv6 address's /64) may hold: a caller opening connections
/// and sending nothing cannot take every place for the time a step allows.
pub const MAX_PAIRING_CONNECTIONS_PER_ADDRESS: usize = 4;

/// A pairing that did not complete.
#[derive(Debug, thiserror::Error)]
pub enum PairingError {
    #[error("invalid pairing request: {0}")]
    InvalidRequest(String),
    #[error("mtls is required for remote pairing: {0}")]
    InsecureEndpoint(String),
    #[error("dial remote endpoint: {0}")]
    Dial(String),
    #[error("websocket: {0}")]
    WebSocket(String),
    #[error("timed out waiting for the peer")]
    Timeout,
    #[error("the peer closed the connection")]
    Closed,
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    #[error("install: {0}")]
    Install(String),
    #[error("pairing not confirmed, nothing recorded: {0}")]
    Unconfirmed(String),
}

fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE_BYTES))
        .max_frame_size(Some(MAX_MESSAGE_BYTES))
}

/// Read the next text message, bounded in time and size.
async fn next_text<S>(
    ws: &mut WebSocketStream<S>,
    step_timeout: Duration,
) -> Result<String, PairingError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        let msg = tokio::time::timeout(step_timeout, ws.next())
            .await
            .map_err(|_| PairingError::Timeout)?;
        match msg {
            None | Some(Ok(Message::Close(_))) => return Err(PairingError::Closed),
            Some(Err(e)) => return Err(PairingError::WebSocket(e.to_string())),
            Some(Ok(Message::Text(t))) => return Ok(t.as_str().to_string()),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Ok(_)) => {
                return Err(PairingError::WebSocket(
                    "binary frames are not part of pairing".into(),
                ))
            }
        }
    }
}

async fn send_all<S>(ws: &mut WebSocketStream<S>, texts: Vec<String>) -> Result<(), PairingError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    for t in texts {
        tokio::time::timeout(STEP_TIMEOUT, ws.send(Message::text(t)))
            .await
            .map_err(|_| PairingError::Timeout)?
            .map_err(|e| PairingError::WebSocket(e.to_string()))?;
    }
    Ok(())
}
