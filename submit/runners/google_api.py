"""Google API and credential errors as one-line `SubmitError`s that name the fix, for the
Vertex AI engine (`submit.runners.vertex`) and its Cloud Logging reader
(`submit.runners.vertex_logs`)."""
from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from typing import Any

import requests
from google.api_core import exceptions as api_exceptions
from google.auth import exceptions as auth_exceptions

from submit.errors import SubmitError

CALL_TIMEOUT_S = 60.0

FIXES = {400: "check the request --dry-run prints", 401: "run `gcloud auth "
         "application-default login`", 403: "run `gcloud auth application-default login` "
         "with an account that has roles/aiplatform.user (and roles/logging.viewer for "
         "logs) in the project, and enable the Vertex AI API", 404: "check --project and "
         "--region, and that the job exists", 409: "pick another job id",
         429: "wait a minute or ask for more quota"}


@contextlib.contextmanager
def api_errors(action: str, handle: Mapping[str, Any]):
    """Google API and credential errors -> one-line SubmitError naming the fix."""
    where = f" in project {handle['project']} region {handle['region']}" \
        if handle.get("project") else ""
    try:
        yield
    except auth_exceptions.DefaultCredentialsError as exc:
        raise SubmitError(f"cannot {action}: no Application Default Credentials "
                          f"({one_line(str(exc))[:160]}); run `gcloud auth "
                          "application-default login` or set GOOGLE_APPLICATION_CREDENTIALS "
                          "to a service account key file") from None
    except (auth_exceptions.GoogleAuthError, requests.RequestException) as exc:
        raise SubmitError(f"cannot {action}{where}: {one_line(str(exc))[:300]}; check the "
                          "network and run `gcloud auth application-default login`") from None
    except api_exceptions.GoogleAPICallError as exc:
        code = int(exc.code) if exc.code else 0
        message = re.sub(r"^[A-Z]+ \S+: ", "", exc.message or str(exc))  # drop method, URL
        fix = FIXES.get(code, "try again later" if code >= 500 else "see the message")
        raise SubmitError(f"Vertex AI refused to {action}{where}: {code} "
                          f"{one_line(message)[:300]}; {fix}") from None
    except api_exceptions.GoogleAPIError as exc:  # retries ran out, and the like
        raise SubmitError(f"cannot {action}{where}: {one_line(str(exc))[:300]}; try again "
                          "later") from None


def one_line(text: str) -> str:
    return " ".join(text.split())
