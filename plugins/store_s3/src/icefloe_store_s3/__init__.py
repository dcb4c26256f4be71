"""Icefloe object store on Amazon S3 and S3-compatible services (backend ``s3``)."""
