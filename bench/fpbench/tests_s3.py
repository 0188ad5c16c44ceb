"""The backup peer's S3 parts without a cluster: cluster.sh rgw's output read back, the rclone
configuration's text and file, and the copy's command line (`python3 -m unittest
fpbench.tests_s3`)."""

import configparser
import os
import stat
import tempfile
import unittest

from fpbench.s3 import (RCLONE_REMOTE, RGW_REGION, S3Endpoint, parse_rgw_start, rclone_config, rclone_copy_cmd,
                        rclone_env, write_rclone_config)

ENDPOINT = S3Endpoint("http://127.0.0.1:32017", "FLASHPATHTESTACCESS1", "flashpath-test-secret-key-for-the-rgw-0001")


class RgwStartOutput(unittest.TestCase):
    def test_url_and_keys_are_the_last_three_lines(self):
        out = "\n".join(["http://127.0.0.1:32017", "FLASHPATHTESTACCESS1", "flashpath-test-secret-key-for-the-rgw-0001", ""])
        self.assertEqual(parse_rgw_start(out), ENDPOINT)
        self.assertEqual(parse_rgw_start("a warning\n" + out).url, ENDPOINT.url)
        self.assertEqual(parse_rgw_start(out).region, RGW_REGION)

    def test_short_or_strange_output_is_refused(self):
        for out in ["", "http://127.0.0.1:32017\nKEY\n", "https://example.com:443\nKEY\nSECRET\n",
                    "http://127.0.0.1:port\nKEY\nSECRET\n", "http://127.0.0.1:1\nKEY\nSEC RET\n"]:
            with self.assertRaises(ValueError, msg=out):
                parse_rgw_start(out)


class RcloneConfig(unittest.TestCase):
    def test_an_s3_remote_of_provider_ceph_with_the_endpoint_and_keys(self):
        text = rclone_config(ENDPOINT)
        parsed = configparser.ConfigParser()
        parsed.read_string(text)
        self.assertEqual(parsed.sections(), [RCLONE_REMOTE])
        self.assertEqual(dict(parsed[RCLONE_REMOTE]), {
            "type": "s3",
            "provider": "Ceph",
            "env_auth": "false",
            "access_key_id": "FLASHPATHTESTACCESS1",
            "secret_access_key": "flashpath-test-secret-key-for-the-rgw-0001",
            "endpoint": "http://127.0.0.1:32017",
            "region": "us-east-1",
        })
        self.assertTrue(text.startswith("[rgw]\ntype = s3\n") and text.endswith("\n"))

    def test_another_remote_name(self):
        self.assertTrue(rclone_config(ENDPOINT, "rgw-2").startswith("[rgw-2]\n"))
        with self.assertRaises(ValueError):
            rclone_config(ENDPOINT, "rgw]\n[evil")

    def test_a_value_that_would_break_the_file_is_refused(self):
        for bad in [S3Endpoint(ENDPOINT.url, "KEY\nendpoint = http://elsewhere", "s"),
                    S3Endpoint(ENDPOINT.url, "KEY", ""),
                    S3Endpoint(ENDPOINT.url, "KEY", "s", region="")]:
            with self.assertRaises(ValueError):
                rclone_config(bad)

    def test_the_file_is_the_text_and_private(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "rclone.conf")
            with open(path, "w") as f:
                f.write("an older, longer file " * 20)
            self.assertEqual(write_rclone_config(path, ENDPOINT), path)
            with open(path) as f:
                self.assertEqual(f.read(), rclone_config(ENDPOINT))
            self.assertEqual(stat.S_IMODE(os.stat(path).st_mode) & 0o077, 0, "the secret key is readable by others")


class CopyCommand(unittest.TestCase):
    def test_copy_into_the_bucket_with_the_generated_config_only(self):
        self.assertEqual(rclone_copy_cmd("/w/rclone.conf", "/w/disk.raw", "backups"),
                         ["rclone", "--config", "/w/rclone.conf", "copy", "/w/disk.raw", "rgw:backups"])
        self.assertEqual(rclone_copy_cmd("/c", "/f", "b", remote="r", extra=["--s3-chunk-size", "64M"])[-3:],
                         ["r:b", "--s3-chunk-size", "64M"])


    def test_rclone_runs_without_aws_and_rclone_variables(self):
        env = {"PATH": "/usr/bin", "HOME": "/h", "AWS_CA_BUNDLE": "/etc/ca.pem", "AWS_PROFILE": "prod",
               "RCLONE_CONFIG_RGW_ENDPOINT": "http://elsewhere", "MY_AWS_NOTE": "kept"}
        self.assertEqual(rclone_env(env), {"PATH": "/usr/bin", "HOME": "/h", "MY_AWS_NOTE": "kept"})
        self.assertIn("AWS_CA_BUNDLE", env, "the caller's environment is left alone")


if __name__ == "__main__":
    unittest.main()
