"""What the annotation app is built with (the `bridge annotate serve` options)."""

from datetime import timedelta

from pydantic import BaseModel, ConfigDict, Field, InstanceOf

from bridge_assets.human.queue import QueueSettings
from bridge_assets.human.votes import IDLE_CAP_SECONDS
from bridge_assets.paths import LakeLocation

IMPORT_PATH = "/admin/import"  # the one route whose body may be a whole votes file


class AppSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    lake: InstanceOf[LakeLocation]        # the pipeline's tables (read only) and the votes store
    secret: str = Field(min_length=16, repr=False)
    with_history: bool = True
    attention_rate: float = Field(0.1, ge=0.0, le=1.0)
    known_rate: float = Field(0.1, ge=0.0, le=1.0)  # known-answer items, while any are loaded
    datasets: tuple[str, ...] | None = None
    graded: tuple[str, ...] = ()          # datasets voted on the grades 0-3 (label_scale: graded)
    lease_minutes: int = Field(30, ge=1)
    session_hours: int = Field(12, ge=1)  # a session ends this long after its login, active or not
    secure_cookies: bool = False          # set when served over HTTPS
    seed: int | None = None               # attention-check draws; fixed in tests
    max_upload_bytes: int = 10 * 2**20
    max_form_bytes: int = 64 * 2**10      # every other body (a vote's comment is 2,000 chars at most)
    busy_seconds: float = Field(3.0, gt=0)  # longest wait for a locked file before answering 503
    idle_cap_seconds: float = Field(IDLE_CAP_SECONDS, gt=0)  # the longest a judgment counts

    def body_limit(self, path: str) -> int:
        return self.max_upload_bytes + self.max_form_bytes if path == IMPORT_PATH else self.max_form_bytes

    @property
    def queue(self) -> QueueSettings:
        return QueueSettings(with_history=self.with_history, attention_rate=self.attention_rate,
                             known_rate=self.known_rate,
                             datasets=self.datasets, lease=timedelta(minutes=self.lease_minutes))
