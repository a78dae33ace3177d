//! Free loopback TCP ports.
//!
//! The kernel hands out a free port when binding to port 0. All requested
//! ports are held open together so one call never returns duplicates, then
//! released so the real server can bind them. Another process may grab a
//! port in between; the cluster start-up retries on "address already in use".

use std::net::{Ipv4Addr, TcpListener};

use crate::error::{io, Result};

/// `n` distinct ports that were free on 127.0.0.1 a moment ago.
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| {
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .map_err(io("binding a free port", "127.0.0.1:0"))
        })
        .collect::<Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| {
            l.local_addr()
                .map(|a| a.port())
                .map_err(io("reading a bound port", "127.0.0.1:0"))
        })
        .collect()
}

/// One free loopback port.
pub fn free_port() -> Result<u16> {
    Ok(free_ports(1)?[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_and_bindable() {
        let ports = free_ports(8).unwrap();
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 8);
        for p in ports {
            assert_ne!(p, 0);
            TcpListener::bind((Ipv4Addr::LOCALHOST, p)).unwrap();
        }
    }
}
