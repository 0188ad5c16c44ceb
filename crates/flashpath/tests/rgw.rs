//! The test cluster's S3 endpoint (Ceph's RADOS Gateway, started by `tests/ceph/cluster.sh rgw`)
//! does what the backup tests will need of it: buckets of their own per caller, objects written
//! and read back byte for byte, listed and deleted, and requests signed with a wrong key
//! refused. The requests are curl's (`--aws-sigv4`), independent of flashpath's code.

mod common;

use common::ceph::{CephCluster, S3Endpoint};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

/// The keys of a bucket listing (ListObjectsV2), in the order the gateway gave them.
fn listed_keys(endpoint: &S3Endpoint) -> Vec<String> {
    let listing = endpoint.request("GET", &format!("/{}?list-type=2", endpoint.bucket), None);
    assert_eq!(listing.status, 200, "listing {}: {}", endpoint.bucket, listing.text());
    let text = listing.text();
    assert!(text.contains("<ListBucketResult"), "not a bucket listing: {text}");
    text.split("<Key>")
        .skip(1)
        .map(|rest| rest.split("</Key>").next().expect("a closed <Key>").to_string())
        .collect()
}

/// The `<Code>` of an S3 error body.
fn error_code(text: &str) -> &str {
    text.split("<Code>").nth(1).and_then(|rest| rest.split("</Code>").next()).unwrap_or("")
}

#[test]
fn objects_round_trip_list_and_delete_in_a_bucket_of_their_own() {
    let Some(cluster) = CephCluster::start_with_rgw() else { return };
    let s3 = cluster.rgw();
    assert!(s3.url.starts_with("http://127.0.0.1:"), "{}", s3.url);
    assert!(listed_keys(&s3).is_empty(), "a new bucket is empty");

    // More than one rados object's worth (4 MiB) and not a round size, and a key with a slash.
    let mut rng = StdRng::seed_from_u64(0x5333);
    let mut big = vec![0u8; 5 * 1024 * 1024 + 17];
    rng.fill_bytes(&mut big);
    let small = b"flashpath backup manifest\n".to_vec();
    let big_path = format!("/{}/images/disk0.raw", s3.bucket);
    let small_path = format!("/{}/manifest", s3.bucket);
    for (path, data) in [(&big_path, &big), (&small_path, &small)] {
        let put = s3.request("PUT", path, Some(data));
        assert_eq!(put.status, 200, "PUT {path}: {}", put.text());
    }
    for (path, data) in [(&big_path, &big), (&small_path, &small)] {
        let got = s3.request("GET", path, None);
        assert_eq!(got.status, 200, "GET {path}: {}", got.text());
        assert_eq!(got.body.len(), data.len(), "GET {path}: length");
        assert!(got.body == *data, "GET {path}: the bytes differ from what was written");
    }
    assert_eq!(listed_keys(&s3), ["images/disk0.raw", "manifest"]);
    let listing = s3.request("GET", &format!("/{}?list-type=2", s3.bucket), None).text();
    assert!(listing.contains(&format!("<Size>{}</Size>", big.len())), "the listing's sizes: {listing}");

    // Overwriting replaces the whole object.
    let replaced = s3.request("PUT", &small_path, Some(b"v2"));
    assert_eq!(replaced.status, 200, "{}", replaced.text());
    assert_eq!(s3.request("GET", &small_path, None).body, b"v2");

    let deleted = s3.request("DELETE", &big_path, None);
    assert_eq!(deleted.status, 204, "DELETE {big_path}: {}", deleted.text());
    let gone = s3.request("GET", &big_path, None);
    assert_eq!(gone.status, 404, "GET after DELETE: {}", gone.text());
    assert_eq!(error_code(&gone.text()), "NoSuchKey", "{}", gone.text());
    assert_eq!(listed_keys(&s3), ["manifest"]);

    // A second caller gets another, empty bucket; the first keeps its object.
    let other = cluster.rgw();
    assert_ne!(other.bucket, s3.bucket);
    assert!(listed_keys(&other).is_empty(), "a second bucket sees the first one's objects");
    assert_eq!(listed_keys(&s3), ["manifest"]);
    let buckets = s3.request("GET", "/", None).text();
    assert!(
        buckets.contains(&format!("<Name>{}</Name>", s3.bucket))
            && buckets.contains(&format!("<Name>{}</Name>", other.bucket)),
        "ListBuckets: {buckets}"
    );
    // Deleting a bucket that holds an object is refused; emptied, it goes.
    let refused = s3.request("DELETE", &format!("/{}", s3.bucket), None);
    assert_eq!(refused.status, 409, "{}", refused.text());
    assert_eq!(error_code(&refused.text()), "BucketNotEmpty");
    assert_eq!(s3.request("DELETE", &small_path, None).status, 204);
    assert_eq!(s3.request("DELETE", &format!("/{}", s3.bucket), None).status, 204);
    assert_eq!(s3.request("GET", &format!("/{}?list-type=2", s3.bucket), None).status, 404);
}

#[test]
fn requests_signed_with_a_wrong_key_are_refused_and_change_nothing() {
    let Some(cluster) = CephCluster::start_with_rgw() else { return };
    let s3 = cluster.rgw();
    let path = format!("/{}/object", s3.bucket);
    assert_eq!(s3.request("PUT", &path, Some(b"original")).status, 200);

    let wrong = "not-the-secret-key-of-this-gateway-000000";
    for (method, body) in [("GET", None), ("PUT", Some(&b"overwritten"[..])), ("DELETE", None)] {
        let refused = s3.request_with_secret(method, &path, body, wrong);
        assert_eq!(refused.status, 403, "{method} with a wrong secret: {}", refused.text());
        assert_eq!(error_code(&refused.text()), "SignatureDoesNotMatch", "{method}: {}", refused.text());
    }
    let unknown = S3Endpoint { access_key: "NOSUCHACCESSKEY00000".into(), ..s3.clone() };
    let refused = unknown.request("GET", &path, None);
    assert_eq!(refused.status, 403, "an unknown access key: {}", refused.text());
    assert_eq!(error_code(&refused.text()), "InvalidAccessKeyId", "{}", refused.text());

    let kept = s3.request("GET", &path, None);
    assert_eq!(
        (kept.status, kept.body.as_slice()),
        (200, &b"original"[..]),
        "the refused requests changed the object"
    );
}
