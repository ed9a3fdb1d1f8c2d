"""The commerce database: the exact schema of the public Olist Brazilian e-commerce dataset
(PRODUCT §4, its misspellings included) filled with seeded synthetic data.

Distributions follow the real dataset's shape (order status ~97% delivered, credit card ~74%,
boleto ~19%, São Paulo-heavy customers in all 27 states, purchases 2016-09 to 2018-10 with
growth, most reviews without text). Written reviews come from `reviews.make_review`, so each
has ground-truth extraction labels, returned to the caller for the task datasets.
"""
from __future__ import annotations

import csv
import hashlib
import random
import sqlite3
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

from foundation.reviews import SCENARIOS, make_review

CATEGORIES_CSV = Path(__file__).parent / "data" / "olist_product_categories.csv"

TABLES: dict[str, tuple[str, ...]] = {
    "olist_orders_dataset": (
        "order_id", "customer_id", "order_status", "order_purchase_timestamp", "order_approved_at",
        "order_delivered_carrier_date", "order_delivered_customer_date", "order_estimated_delivery_date",
    ),
    "olist_order_items_dataset": (
        "order_id", "order_item_id", "product_id", "seller_id", "shipping_limit_date", "price", "freight_value",
    ),
    "olist_order_payments_dataset": (
        "order_id", "payment_sequential", "payment_type", "payment_installments", "payment_value",
    ),
    "olist_order_reviews_dataset": (
        "review_id", "order_id", "review_score", "review_comment_title", "review_comment_message",
        "review_creation_date", "review_answer_timestamp",
    ),
    "olist_customers_dataset": (
        "customer_id", "customer_unique_id", "customer_zip_code_prefix", "customer_city", "customer_state",
    ),
    "olist_sellers_dataset": ("seller_id", "seller_zip_code_prefix", "seller_city", "seller_state"),
    "olist_products_dataset": (
        "product_id", "product_category_name", "product_name_lenght", "product_description_lenght",
        "product_photos_qty", "product_weight_g", "product_length_cm", "product_height_cm", "product_width_cm",
    ),
    "product_category_name_translation": ("product_category_name", "product_category_name_english"),
}

SCHEMA_SQL = """
CREATE TABLE olist_customers_dataset (
    customer_id TEXT PRIMARY KEY, customer_unique_id TEXT NOT NULL, customer_zip_code_prefix TEXT,
    customer_city TEXT, customer_state TEXT);
CREATE TABLE olist_sellers_dataset (
    seller_id TEXT PRIMARY KEY, seller_zip_code_prefix TEXT, seller_city TEXT, seller_state TEXT);
CREATE TABLE product_category_name_translation (
    product_category_name TEXT PRIMARY KEY, product_category_name_english TEXT);
CREATE TABLE olist_products_dataset (
    product_id TEXT PRIMARY KEY, product_category_name TEXT, product_name_lenght INTEGER,
    product_description_lenght INTEGER, product_photos_qty INTEGER, product_weight_g INTEGER,
    product_length_cm INTEGER, product_height_cm INTEGER, product_width_cm INTEGER);
CREATE TABLE olist_orders_dataset (
    order_id TEXT PRIMARY KEY, customer_id TEXT NOT NULL, order_status TEXT NOT NULL,
    order_purchase_timestamp TEXT, order_approved_at TEXT, order_delivered_carrier_date TEXT,
    order_delivered_customer_date TEXT, order_estimated_delivery_date TEXT);
CREATE TABLE olist_order_items_dataset (
    order_id TEXT NOT NULL, order_item_id INTEGER NOT NULL, product_id TEXT, seller_id TEXT,
    shipping_limit_date TEXT, price REAL, freight_value REAL, PRIMARY KEY (order_id, order_item_id));
CREATE TABLE olist_order_payments_dataset (
    order_id TEXT NOT NULL, payment_sequential INTEGER NOT NULL, payment_type TEXT,
    payment_installments INTEGER, payment_value REAL, PRIMARY KEY (order_id, payment_sequential));
CREATE TABLE olist_order_reviews_dataset (
    review_id TEXT PRIMARY KEY, order_id TEXT NOT NULL, review_score INTEGER, review_comment_title TEXT,
    review_comment_message TEXT, review_creation_date TEXT, review_answer_timestamp TEXT);
CREATE INDEX idx_items_order ON olist_order_items_dataset(order_id);
CREATE INDEX idx_payments_order ON olist_order_payments_dataset(order_id);
CREATE INDEX idx_reviews_order ON olist_order_reviews_dataset(order_id);
CREATE INDEX idx_orders_customer ON olist_orders_dataset(customer_id);
CREATE INDEX idx_orders_status ON olist_orders_dataset(order_status);
CREATE INDEX idx_orders_purchase ON olist_orders_dataset(order_purchase_timestamp);
CREATE INDEX idx_items_product ON olist_order_items_dataset(product_id);
CREATE INDEX idx_items_seller ON olist_order_items_dataset(seller_id);
CREATE INDEX idx_products_category ON olist_products_dataset(product_category_name);
CREATE INDEX idx_customers_state ON olist_customers_dataset(customer_state);
CREATE INDEX idx_payments_type ON olist_order_payments_dataset(payment_type);
CREATE VIEW orders_enriched AS
SELECT o.order_id, o.customer_id, c.customer_unique_id, c.customer_city, c.customer_state,
       o.order_status, o.order_purchase_timestamp, o.order_approved_at,
       o.order_delivered_customer_date, o.order_estimated_delivery_date,
       i.order_item_id, i.product_id, i.seller_id, i.price, i.freight_value,
       p.product_category_name, t.product_category_name_english,
       pay.payment_type, pay.payment_installments, pay.payment_value,
       r.review_score
FROM olist_orders_dataset o
JOIN olist_order_items_dataset i ON i.order_id = o.order_id
LEFT JOIN olist_products_dataset p ON p.product_id = i.product_id
LEFT JOIN product_category_name_translation t ON t.product_category_name = p.product_category_name
LEFT JOIN olist_customers_dataset c ON c.customer_id = o.customer_id
LEFT JOIN (SELECT order_id, MIN(payment_type) AS payment_type, MAX(payment_installments) AS payment_installments,
                  SUM(payment_value) AS payment_value
           FROM olist_order_payments_dataset GROUP BY order_id) pay ON pay.order_id = o.order_id
LEFT JOIN (SELECT order_id, MAX(review_score) AS review_score FROM olist_order_reviews_dataset GROUP BY order_id) r
       ON r.order_id = o.order_id;
"""

VIEW_COLUMNS = (
    "order_id", "customer_id", "customer_unique_id", "customer_city", "customer_state", "order_status",
    "order_purchase_timestamp", "order_approved_at", "order_delivered_customer_date",
    "order_estimated_delivery_date", "order_item_id", "product_id", "seller_id", "price", "freight_value",
    "product_category_name", "product_category_name_english", "payment_type", "payment_installments",
    "payment_value", "review_score",
)
SCHEMA_COLUMNS: dict[str, tuple[str, ...]] = {**TABLES, "orders_enriched": VIEW_COLUMNS}

# (UF, weight %, cities as Olist writes them: lower case, no accents)
STATES = (
    ("SP", 42.0, ("sao paulo", "campinas", "guarulhos", "santo andre", "sorocaba", "ribeirao preto", "santos")),
    ("RJ", 12.9, ("rio de janeiro", "niteroi", "nova iguacu", "duque de caxias")),
    ("MG", 11.7, ("belo horizonte", "uberlandia", "contagem", "juiz de fora")),
    ("RS", 5.5, ("porto alegre", "caxias do sul", "pelotas")),
    ("PR", 5.1, ("curitiba", "londrina", "maringa")),
    ("SC", 3.7, ("florianopolis", "joinville", "blumenau")),
    ("BA", 3.4, ("salvador", "feira de santana", "vitoria da conquista")),
    ("DF", 2.2, ("brasilia",)), ("ES", 2.0, ("vitoria", "vila velha", "serra")),
    ("GO", 2.0, ("goiania", "anapolis")), ("PE", 1.7, ("recife", "jaboatao dos guararapes", "olinda")),
    ("CE", 1.3, ("fortaleza", "caucaia")), ("PA", 1.0, ("belem", "ananindeua")),
    ("MT", 0.9, ("cuiaba", "varzea grande")), ("MA", 0.75, ("sao luis", "imperatriz")),
    ("MS", 0.7, ("campo grande", "dourados")), ("PB", 0.55, ("joao pessoa", "campina grande")),
    ("PI", 0.5, ("teresina",)), ("RN", 0.5, ("natal", "mossoro")), ("AL", 0.4, ("maceio",)),
    ("SE", 0.35, ("aracaju",)), ("TO", 0.3, ("palmas",)), ("RO", 0.25, ("porto velho",)),
    ("AM", 0.15, ("manaus",)), ("AC", 0.08, ("rio branco",)), ("AP", 0.07, ("macapa",)), ("RR", 0.05, ("boa vista",)),
)
ORDER_STATUSES = (
    ("delivered", 97.0), ("shipped", 1.1), ("canceled", 0.6), ("unavailable", 0.6), ("invoiced", 0.3),
    ("processing", 0.3), ("created", 0.05), ("approved", 0.05),
)
PAYMENT_TYPES = (("credit_card", 74.0), ("boleto", 19.0), ("voucher", 5.5), ("debit_card", 1.45), ("not_defined", 0.05))
FIRST_PURCHASE = datetime(2016, 9, 4)
LAST_PURCHASE = datetime(2018, 10, 16)
TS = "%Y-%m-%d %H:%M:%S"


def load_categories() -> list[tuple[str, str]]:
    with CATEGORIES_CSV.open(newline="") as f:
        return [(row["product_category_name"], row["product_category_name_english"]) for row in csv.DictReader(f)]


def _hex_id(rng: random.Random) -> str:
    return "%032x" % rng.getrandbits(128)


def _pick(rng: random.Random, weighted: tuple) -> object:
    return rng.choices([w[0] for w in weighted], weights=[w[1] for w in weighted])[0]


def _purchase_time(rng: random.Random) -> datetime:
    # Growth over time: a power of a uniform skews purchases towards later dates.
    span = (LAST_PURCHASE - FIRST_PURCHASE).total_seconds()
    return FIRST_PURCHASE + timedelta(seconds=span * rng.random() ** 0.6)


def generate(db_path: Path, n_orders: int, seed: int, progress: Callable[[int], None] = lambda n: None) -> list[dict]:
    """Write a fresh DB at db_path; return the written reviews with their extraction labels."""
    rng = random.Random(seed)
    db_path.unlink(missing_ok=True)
    con = sqlite3.connect(db_path)
    con.executescript(SCHEMA_SQL)
    categories = load_categories()
    con.executemany("INSERT INTO product_category_name_translation VALUES (?, ?)", categories)

    def place() -> tuple[str, str, str]:
        uf, _, cities = STATES[rng.choices(range(len(STATES)), weights=[s[1] for s in STATES])[0]]
        return uf, rng.choice(cities), f"{rng.randint(1000, 99999):05d}"

    sellers = []
    for _ in range(max(60, n_orders // 20)):
        uf, city, zip_prefix = place()
        sellers.append((_hex_id(rng), zip_prefix, city, uf))
    con.executemany("INSERT INTO olist_sellers_dataset VALUES (?, ?, ?, ?)", sellers)

    category_weights = [rng.paretovariate(1.2) for _ in categories]
    category_price = {name: rng.uniform(25, 250) for name, _ in categories}
    products = []
    for _ in range(max(200, n_orders // 4)):
        name = rng.choices(categories, weights=category_weights)[0][0]
        products.append((
            _hex_id(rng), name, rng.randint(20, 64), rng.randint(100, 3000), rng.randint(1, 8),
            rng.randint(100, 20000), rng.randint(15, 100), rng.randint(2, 80), rng.randint(10, 80),
        ))
    con.executemany("INSERT INTO olist_products_dataset VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", products)

    unique_customers: list[tuple[str, str, str, str]] = []
    orders, items, payments, reviews, customers, labelled = [], [], [], [], [], []
    for n in range(n_orders):
        if n < len(STATES):  # every state has customers
            uf, _, cities = STATES[n]
            customer = (_hex_id(rng), f"{rng.randint(1000, 99999):05d}", cities[0], uf)
            unique_customers.append(customer)
        elif unique_customers and rng.random() < 0.03:  # a returning customer
            customer = rng.choice(unique_customers)
        else:
            uf, city, zip_prefix = place()
            customer = (_hex_id(rng), zip_prefix, city, uf)
            unique_customers.append(customer)
        customer_id, order_id = _hex_id(rng), _hex_id(rng)
        customers.append((customer_id, customer[0], customer[1], customer[2], customer[3]))

        status = _pick(rng, ORDER_STATUSES)
        bought = _purchase_time(rng)
        approved = bought + timedelta(minutes=rng.randint(10, 2880)) if status != "created" else None
        estimated = (bought + timedelta(days=rng.randint(12, 40))).replace(hour=0, minute=0, second=0)
        carrier = delivered = None
        late_days = 0
        if status in ("delivered", "shipped"):
            carrier = approved + timedelta(days=rng.uniform(0.5, 5))
        if status == "delivered":
            late_days = rng.choice((0,) * 9 + (rng.randint(1, 25),))  # ~8% arrive late
            if late_days:
                delivered = estimated + timedelta(days=late_days, hours=rng.randint(8, 20))
            else:
                delivered = carrier + timedelta(days=rng.uniform(1, max(1.5, (estimated - carrier).days - 1)))
        orders.append((
            order_id, customer_id, status, bought.strftime(TS), approved and approved.strftime(TS),
            carrier and carrier.strftime(TS), delivered and delivered.strftime(TS), estimated.strftime(TS),
        ))

        total = 0.0
        for item_no in range(1, rng.choices((1, 2, 3, 4), weights=(88, 9, 2, 1))[0] + 1):
            product = rng.choice(products)
            price = round(category_price[product[1]] * rng.lognormvariate(0, 0.5), 2)
            freight = round(rng.uniform(7, 45) + product[5] / 2000, 2)
            total += price + freight
            seller = rng.choice(sellers)
            items.append((order_id, item_no, product[0], seller[0],
                          (bought + timedelta(days=rng.randint(2, 7))).strftime(TS), price, freight))

        kind = _pick(rng, PAYMENT_TYPES)
        if kind == "voucher" and rng.random() < 0.5:  # a voucher topped up by card
            part = round(min(total * 0.5, rng.uniform(10, 60)), 2)
            payments.append((order_id, 1, "voucher", 1, part))
            payments.append((order_id, 2, "credit_card", rng.randint(1, 10), round(total - part, 2)))
        else:
            installments = rng.choices(range(1, 25), weights=[30, 12, 10, 8, 6, 5, 3, 4, 2, 8] + [0.3] * 14)[0] \
                if kind == "credit_card" else 1
            payments.append((order_id, 1, kind, installments, round(total, 2)))

        if status in ("delivered", "shipped", "canceled", "unavailable") and rng.random() < 0.98:
            created = (delivered or estimated) + timedelta(days=rng.randint(0, 3))
            answered = created + timedelta(days=rng.uniform(0.5, 4))
            review_id = _hex_id(rng)
            text = title = None
            if rng.random() < 0.42:  # most reviews carry no text
                scenario = None
                if late_days:
                    late_name = rng.choice(("delivery_delay", "mixed"))
                    scenario = next(s for s in SCENARIOS if s.name == late_name)
                text, reference, score = make_review(rng, scenario)
                labelled.append({"review_id": review_id, "order_id": order_id, "review": text, "reference": reference})
            else:
                score = rng.choices((5, 4, 3, 2, 1), weights=(58, 19, 8, 3, 12))[0] if not late_days else rng.choice((1, 2, 3))
            reviews.append((review_id, order_id, score, title, text, created.strftime(TS), answered.strftime(TS)))
        if n % 500 == 0:
            progress(n)

    con.executemany("INSERT INTO olist_customers_dataset VALUES (?, ?, ?, ?, ?)", customers)
    con.executemany("INSERT INTO olist_orders_dataset VALUES (?, ?, ?, ?, ?, ?, ?, ?)", orders)
    con.executemany("INSERT INTO olist_order_items_dataset VALUES (?, ?, ?, ?, ?, ?, ?)", items)
    con.executemany("INSERT INTO olist_order_payments_dataset VALUES (?, ?, ?, ?, ?)", payments)
    con.executemany("INSERT INTO olist_order_reviews_dataset VALUES (?, ?, ?, ?, ?, ?, ?)", reviews)
    con.commit()
    con.execute("VACUUM")
    con.close()
    progress(n_orders)
    return labelled


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
