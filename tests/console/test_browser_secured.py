"""The console in Chromium against a SASL_SSL broker with ACLs, signed in to the cluster as
an ordinary user (SCRAM-SHA-512 credentials in the console's client properties, as
`onceflow console --command-config` passes them).

The user may see one topic and the transactional ids; the pages that use the AdminClient
(metadata, offsets) and those that use raw connections (transactions, the LSO's holder)
both work over TLS + SASL, and a topic the user may not Describe is not listed, as Kafka
hides it from Metadata. A wrong password gives a page that says so, never the password.
"""

from __future__ import annotations

import contextlib
import uuid

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from selenium.webdriver.common.by import By

from tests.console.support import number_in, running_console, screenshot, text_of, wait_for
from tests.helpers import TIMEOUT_S, unique


def _grant(admin: AdminClient, *bindings: tuple[ResourceType, str, AclOperation]) -> None:
    acls = [AclBinding(rtype, name, ResourcePatternType.LITERAL, "User:app", "*", operation,
                       AclPermissionType.ALLOW) for rtype, name, operation in bindings]
    for future in admin.create_acls(acls).values():
        future.result(TIMEOUT_S)


def _console_properties(config: dict) -> dict:
    return {k: v for k, v in config.items() if k != "bootstrap.servers"}


def test_console_against_sasl_ssl_with_the_users_credentials(onceflow_secure_broker, browser,
                                                              tmp_path):
    secure = onceflow_secure_broker
    admin = AdminClient(secure.client_config("admin"))
    visible, hidden = unique("console-secured"), unique("console-hidden")
    for future in admin.create_topics([NewTopic(visible, 1), NewTopic(hidden, 1)]).values():
        future.result(TIMEOUT_S)
    _grant(admin, (ResourceType.TOPIC, visible, AclOperation.READ),
           (ResourceType.TOPIC, visible, AclOperation.DESCRIBE),
           (ResourceType.TOPIC, visible, AclOperation.DESCRIBE_CONFIGS),
           (ResourceType.TRANSACTIONAL_ID, "*", AclOperation.DESCRIBE))
    # the admin leaves a transaction open on the visible topic: LSO 0 < HW 1
    transactional_id = f"secured-{uuid.uuid4().hex[:8]}"
    producer = Producer({**secure.client_config("admin"), "transactional.id": transactional_id})
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    producer.produce(visible, value=b"open", partition=0)
    assert producer.flush(TIMEOUT_S) == 0
    try:
        properties = _console_properties(secure.client_config("app"))
        with running_console(secure.bootstrap_servers, properties=properties) as console:
            browser.get(f"{console.url}/topics")
            wait_for(browser, lambda d: visible in text_of(d, "#topics"),
                     message="the topic the user may describe")
            assert hidden not in text_of(browser, "#topics")    # Kafka hides it
            browser.get(f"{console.url}/topics/{visible}/0")
            wait_for(browser, lambda d: number_in(d, "#lso") == 0 and number_in(d, "#hw") == 1,
                     message="LSO 0 < HW 1 over SASL_SSL")
            wait_for(browser, lambda d: "producer" in text_of(d, "#holder"),
                     message="the LSO's holder, asked over a raw SASL_SSL connection")
            screenshot(browser, "secured-partition", tmp_path)
            browser.get(f"{console.url}/transactions")
            row = f'#transaction-table tr[data-transactional-id="{transactional_id}"]'
            wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, row),
                     message="the open transaction, listed over SASL_SSL")

        wrong = {**properties, "sasl.password": "not-the-password"}
        with running_console(secure.bootstrap_servers, properties=wrong) as console:
            browser.get(f"{console.url}/topics")
            page = text_of(browser, "body")
            assert "not-the-password" not in browser.page_source
            assert "authentic" in page.lower(), page[:500]
    finally:
        with contextlib.suppress(KafkaException):
            producer.abort_transaction(TIMEOUT_S)
