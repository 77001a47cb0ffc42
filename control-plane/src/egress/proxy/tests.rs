use super::*;

#[test]
fn plain_requests_to_a_proxy_get_our_credentials_and_become_single_use() {
    let head = b"GET http://example.test/a HTTP/1.1\r\nHost: example.test\r\n\
Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic c3RhbGU=\r\nAccept: */*\r\n\r\n";
    let request = ProxyRequest::parse(head).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((request.host.as_str(), request.port), ("example.test", 80));
    let out = String::from_utf8(request.outgoing_head("http://example.test/a", Some("Basic dTpw")))
        .unwrap_or_default();
    assert_eq!(
        out,
        "GET http://example.test/a HTTP/1.1\r\nHost: example.test\r\nAccept: */*\r\n\
Proxy-Authorization: Basic dTpw\r\nConnection: close\r\n\r\n"
    );
    let direct =
        String::from_utf8(request.outgoing_head(&request.origin_target, None)).unwrap_or_default();
    assert!(direct.starts_with("GET /a HTTP/1.1\r\n"), "{direct}");
}

#[test]
fn tunnels_keep_their_headers() {
    let head = b"CONNECT [2001:db8::1]:443 HTTP/1.1\r\nHost: [2001:db8::1]:443\r\n\r\n";
    let request = ProxyRequest::parse(head).unwrap_or_else(|e| panic!("{e}"));
    assert!(request.is_tunnel());
    assert_eq!(request.authority(), "[2001:db8::1]:443");
    assert!(ProxyRequest::parse(b"NOT HTTP\r\n\r\n").is_err());
    assert!(ProxyRequest::parse(b"GET /relative HTTP/1.1\r\n\r\n").is_err());
}

async fn request(socket: &Path, head: &str) -> (UnixStream, String) {
    let mut client = UnixStream::connect(socket).await.expect("connects");
    client.write_all(head.as_bytes()).await.expect("writes");
    let mut answer = vec![0u8; 1024];
    let read = client.read(&mut answer).await.expect("reads");
    (client, String::from_utf8_lossy(&answer[..read]).into_owned())
}

#[tokio::test]
async fn refuses_internal_addresses_and_closes_tunnels_an_allowlist_revokes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("egress.sock");
    let target = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let port = target.local_addr().expect("address").port();
    let loopback_allowed = EgressPolicy::new(vec!["127.0.0.1".parse().expect("allowance")]);
    let server = EgressServer::start(&socket, None, loopback_allowed, VmEgress::default(), None)
        .expect("starts");

    // The operator allowed 127.0.0.1, not the rest of loopback or link-local.
    for refused in ["127.0.0.2:80", "169.254.169.254:80", "[::1]:80", "10.0.0.1:80"] {
        let (_, answer) = request(&socket, &format!("CONNECT {refused} HTTP/1.1\r\n\r\n")).await;
        assert!(answer.starts_with("HTTP/1.1 403"), "{refused}: {answer}");
        assert!(answer.contains("X-Kernel-Proxy-Error: network_policy_denied"), "{answer}");
    }
    let (mut tunnel, answer) =
        request(&socket, &format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n")).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let (_accepted, _) = target.accept().await.expect("the tunnel reached the target");

    // An allowlist without the tunnel's host closes it.
    server.set_allowed_hosts(Some(HostAllowlist::parse(&["example.com".into()]).expect("valid")));
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), tunnel.read_to_end(&mut rest)).await;
    assert!(matches!(closed, Ok(Ok(0))), "{closed:?}");
    let (_, answer) = request(&socket, &format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n")).await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
}

#[tokio::test]
async fn switching_the_proxy_closes_tunnels_through_the_old_route_only() {
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("egress.sock");
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let route = ProxyRoute {
        address: upstream.local_addr().expect("address").to_string(),
        username: None,
        password: None,
        bypass_hosts: vec!["direct.test".into()],
    };
    let egress = VmEgress { upstream: Some(route.clone()), allowed_hosts: None };
    let server =
        EgressServer::start(&socket, None, EgressPolicy::default(), egress, None).expect("starts");
    let accepted = tokio::spawn(async move {
        let (mut connection, _) = upstream.accept().await.expect("accepts");
        let mut head = vec![0u8; 1024];
        let _ = connection.read(&mut head).await.expect("reads");
        connection
            .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            .await
            .expect("answers");
        connection
    });
    let (mut tunnel, answer) = request(&socket, "CONNECT a.test:443 HTTP/1.1\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let _upstream_side = accepted.await.expect("upstream task");

    // The same route again, or a change only for hosts it bypasses, keeps it open.
    server.set_upstream(Some(route.clone()));
    server.set_upstream(Some(ProxyRoute {
        bypass_hosts: vec!["direct.test".into(), "other.test".into()],
        ..route
    }));
    let mut byte = [0u8; 1];
    let still_open = tokio::time::timeout(Duration::from_millis(300), tunnel.read(&mut byte)).await;
    assert!(still_open.is_err(), "{still_open:?}");

    // Going direct closes it.
    server.set_upstream(None);
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), tunnel.read_to_end(&mut rest)).await;
    assert!(matches!(closed, Ok(Ok(0))), "{closed:?}");
}

#[tokio::test]
async fn a_plain_request_reaches_the_upstream_alone_with_our_credentials() {
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("egress.sock");
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let egress = VmEgress {
        upstream: Some(ProxyRoute {
            address: upstream.local_addr().expect("address").to_string(),
            username: Some("u".into()),
            password: Some("p".into()),
            bypass_hosts: Vec::new(),
        }),
        allowed_hosts: Some(HostAllowlist::parse(&["a.test".into()]).expect("valid")),
    };
    let _server =
        EgressServer::start(&socket, None, EgressPolicy::default(), egress, None).expect("starts");
    let received = tokio::spawn(async move {
        let (mut connection, _) = upstream.accept().await.expect("accepts");
        let mut seen = vec![0u8; 4096];
        let read = connection.read(&mut seen).await.expect("reads");
        connection
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            .await
            .expect("answers");
        // Whatever else arrives before the client's side closes.
        let mut more = Vec::new();
        let _ =
            tokio::time::timeout(Duration::from_secs(1), connection.read_to_end(&mut more)).await;
        seen.truncate(read);
        seen.extend(more);
        String::from_utf8_lossy(&seen).into_owned()
    });
    // A second request pipelined behind the first names a host the allowlist refuses.
    let (_, answer) = request(
        &socket,
        "POST http://a.test/x HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\n\r\nabc\
         GET http://evil.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n",
    )
    .await;
    assert!(answer.ends_with("ok"), "{answer}");
    let seen = received.await.expect("upstream task");
    assert!(seen.starts_with("POST http://a.test/x HTTP/1.1\r\n"), "{seen}");
    assert!(seen.contains("Proxy-Authorization: Basic dTpw\r\n"), "{seen}");
    assert!(seen.ends_with("\r\n\r\nabc"), "{seen}");
    assert!(!seen.contains("evil.test"), "{seen}");
}

#[test]
fn bypass_patterns() {
    let patterns = ["intranet.test".to_owned(), "*.corp.test".to_owned(), "<local>".to_owned()];
    assert!(bypassed(&patterns, "intranet.test"));
    assert!(bypassed(&patterns, "a.corp.test"));
    assert!(bypassed(&patterns, "printer"));
    assert!(!bypassed(&patterns, "example.com"));
}
