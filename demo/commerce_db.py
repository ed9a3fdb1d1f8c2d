"""The demo's commerce database: the schema of `common.commerce` (the public Olist Brazilian
e-commerce dataset's) filled with seeded synthetic data.

Distributions follow the real dataset's shape (order status ~97% delivered, credit card ~74%,
boleto ~19%, São Paulo-heavy customers in all 27 states, purchases 2016-09 to 2018-10 with
growth, most reviews without text). Written reviews come from `reviews.make_review` about the
store's own catalogue (`reviews.TEAM_PRODUCTS`), so each has ground-truth extraction labels,
returned to the caller for the task datasets.
"""
from __future__ import annotations

import csv
import hashlib
import random
import sqlite3
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

from common.commerce import ORDER_STATUSES as STATUS_NAMES
from common.commerce import PAYMENT_TYPES as PAYMENT_NAMES
from common.commerce import SCHEMA_SQL, UF_CODES
from demo.reviews import SCENARIOS, TEAM_PRODUCTS, make_review

CATEGORIES_CSV = Path(__file__).parent / "data" / "olist_product_categories.csv"

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
assert {s[0] for s in STATES} == UF_CODES and {s[0] for s in ORDER_STATUSES} == set(STATUS_NAMES)
assert {p[0] for p in PAYMENT_TYPES} == set(PAYMENT_NAMES)
FIRST_PURCHASE = datetime(2016, 9, 4)
LAST_PURCHASE = datetime(2018, 10, 16)
TS = "%Y-%m-%d %H:%M:%S"


def load_categories() -> list[tuple[str, str]]:
    with CATEGORIES_CSV.open(newline="") as f:
        return [(row["product_category_name"], row["product_category_name_english"]) for row in csv.DictReader(f)]


def _hex_id(rng: random.Random) -> str:
    return f"{rng.getrandbits(128):032x}"


def _pick(rng: random.Random, weighted: tuple) -> object:
    return rng.choices([w[0] for w in weighted], weights=[w[1] for w in weighted])[0]


def _purchase_time(rng: random.Random) -> datetime:
    # Growth over time: a power of a uniform skews purchases towards later dates.
    span = (LAST_PURCHASE - FIRST_PURCHASE).total_seconds()
    return FIRST_PURCHASE + timedelta(seconds=span * rng.random() ** 0.6)


def _place(rng: random.Random) -> tuple[str, str, str]:
    uf, _, cities = STATES[rng.choices(range(len(STATES)), weights=[s[1] for s in STATES])[0]]
    return uf, rng.choice(cities), f"{rng.randint(1000, 99999):05d}"


def _sellers(rng: random.Random, n_orders: int) -> list[tuple]:
    sellers = []
    for _ in range(max(60, n_orders // 20)):
        uf, city, zip_prefix = _place(rng)
        sellers.append((_hex_id(rng), zip_prefix, city, uf))
    return sellers


def _products(rng: random.Random, n_orders: int, categories: list[tuple[str, str]]) -> tuple[list[tuple], dict[str, float]]:
    category_weights = [rng.paretovariate(1.2) for _ in categories]
    category_price = {name: rng.uniform(25, 250) for name, _ in categories}
    products = []
    for _ in range(max(200, n_orders // 4)):
        name = rng.choices(categories, weights=category_weights)[0][0]
        products.append((
            _hex_id(rng), name, rng.randint(20, 64), rng.randint(100, 3000), rng.randint(1, 8),
            rng.randint(100, 20000), rng.randint(15, 100), rng.randint(2, 80), rng.randint(10, 80),
        ))
    return products, category_price


def _customer(rng: random.Random, n: int, unique_customers: list[tuple]) -> tuple[str, str, str, str]:
    """The order's customer: every state gets one first, then ~3% returning customers."""
    if n < len(STATES):
        uf, _, cities = STATES[n]
        customer = (_hex_id(rng), f"{rng.randint(1000, 99999):05d}", cities[0], uf)
    elif unique_customers and rng.random() < 0.03:
        return rng.choice(unique_customers)
    else:
        uf, city, zip_prefix = _place(rng)
        customer = (_hex_id(rng), zip_prefix, city, uf)
    unique_customers.append(customer)
    return customer


def _timeline(rng: random.Random, status: str) -> tuple[datetime, datetime | None, datetime | None, datetime | None, datetime, int]:
    """Purchase, approval, carrier, delivery and estimated dates, and the days it arrived late (~8%)."""
    bought = _purchase_time(rng)
    approved = bought + timedelta(minutes=rng.randint(10, 2880)) if status != "created" else None
    estimated = (bought + timedelta(days=rng.randint(12, 40))).replace(hour=0, minute=0, second=0)
    carrier = delivered = None
    late_days = 0
    if status in ("delivered", "shipped"):
        carrier = approved + timedelta(days=rng.uniform(0.5, 5))
    if status == "delivered":
        late_days = rng.choice((0,) * 9 + (rng.randint(1, 25),))
        if late_days:
            delivered = estimated + timedelta(days=late_days, hours=rng.randint(8, 20))
        else:
            delivered = carrier + timedelta(days=rng.uniform(1, max(1.5, (estimated - carrier).days - 1)))
    return bought, approved, carrier, delivered, estimated, late_days


def _items(rng: random.Random, order_id: str, bought: datetime, products: list[tuple], category_price: dict,
           sellers: list[tuple]) -> tuple[list[tuple], float]:
    items, total = [], 0.0
    for item_no in range(1, rng.choices((1, 2, 3, 4), weights=(88, 9, 2, 1))[0] + 1):
        product = rng.choice(products)
        price = round(category_price[product[1]] * rng.lognormvariate(0, 0.5), 2)
        freight = round(rng.uniform(7, 45) + product[5] / 2000, 2)
        total += price + freight
        seller = rng.choice(sellers)
        items.append((order_id, item_no, product[0], seller[0], (bought + timedelta(days=rng.randint(2, 7))).strftime(TS),
                      price, freight))
    return items, total


def _payments(rng: random.Random, order_id: str, total: float) -> list[tuple]:
    kind = _pick(rng, PAYMENT_TYPES)
    if kind == "voucher" and rng.random() < 0.5:  # a voucher topped up by card
        part = round(min(total * 0.5, rng.uniform(10, 60)), 2)
        return [(order_id, 1, "voucher", 1, part), (order_id, 2, "credit_card", rng.randint(1, 10), round(total - part, 2))]
    installments = rng.choices(range(1, 25), weights=[30, 12, 10, 8, 6, 5, 3, 4, 2, 8] + [0.3] * 14)[0] \
        if kind == "credit_card" else 1
    return [(order_id, 1, kind, installments, round(total, 2))]


def _review(rng: random.Random, order_id: str, delivered: datetime | None, estimated: datetime, late_days: int
            ) -> tuple[tuple, dict | None]:
    """The order's review row, and its extraction labels when it has text (~42%; a late order's
    text is about the delay)."""
    created = (delivered or estimated) + timedelta(days=rng.randint(0, 3))
    answered = created + timedelta(days=rng.uniform(0.5, 4))
    review_id = _hex_id(rng)
    text = title = labelled = None
    if rng.random() < 0.42:
        scenario = None
        if late_days:
            late_name = rng.choice(("delivery_delay", "mixed"))
            scenario = next(s for s in SCENARIOS if s.name == late_name)
        text, reference, score = make_review(rng, scenario, TEAM_PRODUCTS)
        labelled = {"review_id": review_id, "order_id": order_id, "review": text, "reference": reference}
    else:
        score = rng.choices((5, 4, 3, 2, 1), weights=(58, 19, 8, 3, 12))[0] if not late_days else rng.choice((1, 2, 3))
    return (review_id, order_id, score, title, text, created.strftime(TS), answered.strftime(TS)), labelled


def generate(db_path: Path, n_orders: int, seed: int, progress: Callable[[int], None] = lambda n: None) -> list[dict]:
    """Write a fresh DB at db_path; return the written reviews with their extraction labels."""
    rng = random.Random(seed)
    categories = load_categories()
    sellers = _sellers(rng, n_orders)
    products, category_price = _products(rng, n_orders, categories)
    unique_customers: list[tuple] = []
    orders, items, payments, reviews, customers, labelled = [], [], [], [], [], []
    for n in range(n_orders):
        customer = _customer(rng, n, unique_customers)
        customer_id, order_id = _hex_id(rng), _hex_id(rng)
        customers.append((customer_id, *customer))
        status = _pick(rng, ORDER_STATUSES)
        bought, approved, carrier, delivered, estimated, late_days = _timeline(rng, status)
        orders.append((order_id, customer_id, status, bought.strftime(TS), approved and approved.strftime(TS),
                       carrier and carrier.strftime(TS), delivered and delivered.strftime(TS), estimated.strftime(TS)))
        order_items, total = _items(rng, order_id, bought, products, category_price, sellers)
        items += order_items
        payments += _payments(rng, order_id, total)
        if status in ("delivered", "shipped", "canceled", "unavailable") and rng.random() < 0.98:
            review, labels = _review(rng, order_id, delivered, estimated, late_days)
            reviews.append(review)
            if labels:
                labelled.append(labels)
        if n % 500 == 0:
            progress(n)
    _write(db_path, categories, sellers, products, customers, orders, items, payments, reviews)
    progress(n_orders)
    return labelled


def _write(db_path: Path, categories, sellers, products, customers, orders, items, payments, reviews) -> None:
    db_path.unlink(missing_ok=True)
    con = sqlite3.connect(db_path)
    con.executescript(SCHEMA_SQL)
    for table, rows in (("product_category_name_translation", categories), ("olist_sellers_dataset", sellers),
                        ("olist_products_dataset", products), ("olist_customers_dataset", customers),
                        ("olist_orders_dataset", orders), ("olist_order_items_dataset", items),
                        ("olist_order_payments_dataset", payments), ("olist_order_reviews_dataset", reviews)):
        if rows:
            con.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)
    con.commit()
    con.execute("VACUUM")
    con.close()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
