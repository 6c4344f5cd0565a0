"""The offline shop's product types and text pieces: the data the catalogue is generated from."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProductType:
    """One kind of product (WebShop's ``query``), with the vocabulary its products are drawn from."""

    category: str
    query: str  # WebShop's per-product search query; also the noun phrase used in instructions
    noun: str  # title noun phrase
    path: str  # product_category path below the category root
    models: tuple[str, ...]  # noun modifiers in titles ("tea tree" shampoo)
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]  # (option name, value pool); "size" matches exactly
    price: tuple[float, float]


def _t(category, query, noun, path, models, attributes, options, price) -> ProductType:
    split = lambda s: tuple(s.split("|"))  # noqa: E731
    return ProductType(
        category=category,
        query=query,
        noun=noun,
        path=path,
        models=split(models),
        attributes=split(attributes),
        options=tuple((name, split(values)) for name, values in options.items()),
        price=price,
    )


CATEGORY_ROOTS = {
    "beauty": "Beauty & Personal Care",
    "electronics": "Electronics",
    "fashion": "Clothing, Shoes & Jewelry",
    "food": "Grocery & Gourmet Food",
    "furniture": "Home & Kitchen › Furniture",
    "garden": "Patio, Lawn & Garden",
}

_COLORS = (
    "black|white|navy|grey|beige|pink|green|olive|burgundy|brown|silver|gold|teal|purple|ivory|khaki|coral"
)
_WOOD = "black|white|walnut|grey|brown|espresso|natural"
_APPAREL = "small|medium|large|x-large|xx-large"

PRODUCT_TYPES: tuple[ProductType, ...] = (
    # beauty
    _t("beauty", "shampoo", "Shampoo", "Hair Care › Shampoo & Conditioner › Shampoos",
       "argan oil|tea tree|biotin|keratin|rosemary",
       "paraben free|sulfate free|dry hair|hair growth|natural ingredients|color treated|cruelty free",
       {"size": "8 fl oz|16 fl oz|32 fl oz", "scent": "lavender|coconut|citrus|eucalyptus|unscented"}, (6, 40)),
    _t("beauty", "face moisturizer", "Face Moisturizer", "Skin Care › Face › Creams & Moisturizers",
       "hyaluronic|vitamin c|retinol|ceramide|niacinamide",
       "sensitive skin|fine lines|oil free|dermatologist tested|fragrance free|anti aging|non greasy",
       {"size": "1.7 oz|3.4 oz|6.8 oz", "style": "daily|overnight|tinted"}, (9, 60)),
    _t("beauty", "lipstick", "Lipstick", "Makeup › Lips › Lipstick",
       "velvet|satin|silk|butter|gloss",
       "long lasting|cruelty free|matte finish|moisturizing|vegan|waterproof|high pigment",
       {"color": "red|pink|coral|burgundy|purple|brown|nude"}, (5, 30)),
    _t("beauty", "nail polish", "Nail Polish", "Makeup › Nails › Nail Polish",
       "lacquer|enamel|shimmer|glitter|chrome",
       "quick dry|non toxic|long lasting|chip resistant|vegan|high shine",
       {"color": "red|pink|coral|purple|navy|teal|black|white|gold"}, (4, 20)),
    _t("beauty", "body wash", "Body Wash", "Bath & Body › Cleansers › Body Washes",
       "shea butter|oatmeal|charcoal|honey|aloe",
       "sensitive skin|paraben free|moisturizing|natural ingredients|dry skin|sulfate free",
       {"size": "12 fl oz|18 fl oz|24 fl oz", "scent": "lavender|coconut|citrus|eucalyptus|unscented"}, (5, 25)),
    _t("beauty", "makeup brush set", "Makeup Brush Set", "Tools & Accessories › Makeup Brushes & Tools › Brush Sets",
       "kabuki|contour|foundation|blending|travel",
       "synthetic bristles|cruelty free|travel case|easy clean|professional|dense bristles",
       {"color": "black|pink|white|gold|silver|purple"}, (8, 45)),
    # electronics
    _t("electronics", "wireless earbuds", "Wireless Earbuds", "Headphones, Earbuds & Accessories › Earbuds",
       "sport|studio|active|mini|pro",
       "noise cancelling|long battery life|water resistant|fast charging|bluetooth|built in microphone",
       {"color": "black|white|navy|silver|green|pink"}, (19, 150)),
    _t("electronics", "phone case", "Phone Case", "Cell Phones & Accessories › Cases, Holsters & Sleeves › Basic Cases",
       "armor|slim fit|clear view|leather wallet|rugged",
       "shockproof|wireless charging compatible|scratch resistant|kickstand|drop protection|anti yellowing",
       {"size": "iphone 13|iphone 14|galaxy s22|pixel 7", "color": "black|navy|green|purple|pink|red|blue"}, (6, 30)),
    _t("electronics", "usb c cable", "USB C Cable", "Computers & Accessories › Cables & Accessories › USB Cables",
       "nylon|charging|sync|right angle|coiled",
       "fast charging|braided|durable|high speed data|tangle free",
       {"size": "3 ft|6 ft|10 ft", "color": "black|white|grey|red|blue"}, (5, 22)),
    _t("electronics", "bluetooth speaker", "Bluetooth Speaker", "Portable Audio & Video › Portable Speakers & Docks",
       "boom|party|outdoor|mini|stereo",
       "waterproof|portable|long battery life|deep bass|built in microphone|stereo sound",
       {"color": "black|navy|teal|red|grey|orange"}, (15, 120)),
    _t("electronics", "laptop stand", "Laptop Stand", "Computers & Accessories › Laptop Accessories › Stands",
       "desk|riser|tower|portable|cooling",
       "adjustable height|aluminum|foldable|ventilated|non slip|ergonomic",
       {"color": "silver|black|grey|gold"}, (12, 60)),
    _t("electronics", "power bank", "Power Bank", "Cell Phones & Accessories › Chargers & Power Adapters › Portable Power Banks",
       "compact|solar|magnetic|travel|rugged",
       "fast charging|portable|led display|dual usb|slim|high capacity",
       {"size": "10000mah|20000mah|26800mah", "color": "black|white|blue|pink"}, (15, 70)),
    # fashion
    _t("fashion", "running shoes", "Running Shoes", "Men › Shoes › Athletic › Running › Road Running",
       "trail|road|mesh|knit|cushion",
       "non slip|rubber sole|breathable|lightweight|arch support|memory foam|wide width",
       {"size": "7|8|9|10|11|12", "color": "black|white|grey|navy|blue|red|green"}, (30, 140)),
    _t("fashion", "t-shirt", "T-Shirt", "Men › Clothing › Shirts › T-Shirts",
       "graphic|pocket|henley|athletic|vintage",
       "machine wash|short sleeve|cotton|relaxed fit|moisture wicking|crew neck",
       {"size": _APPAREL, "color": _COLORS}, (8, 35)),
    _t("fashion", "jeans", "Jeans", "Women › Clothing › Jeans",
       "skinny|bootcut|mom|boyfriend|flare",
       "slim fit|machine wash|stretch|button closure|high waist|straight leg",
       {"size": "24|26|28|30|32|34", "color": "indigo|black|grey|white|blue"}, (20, 90)),
    _t("fashion", "dress", "Dress", "Women › Clothing › Dresses › Casual",
       "wrap|maxi|shift|swing|sundress",
       "machine wash|sleeveless|midi length|polyester|v neck|pockets",
       {"size": _APPAREL, "color": _COLORS}, (18, 80)),
    _t("fashion", "sunglasses", "Sunglasses", "Men › Accessories › Sunglasses & Eyewear Accessories › Sunglasses",
       "aviator|wayfarer|round|sport|cat eye",
       "polarized|uv protection|lightweight|metal frame|unisex|scratch resistant",
       {"color": "black|gold|silver|brown|tortoise"}, (10, 70)),
    _t("fashion", "backpack", "Backpack", "Luggage & Travel Gear › Backpacks › Casual Daypacks",
       "hiking|laptop|school|travel|rolltop",
       "water resistant|laptop compartment|lightweight|padded straps|anti theft|large capacity",
       {"color": "black|grey|navy|olive|burgundy|khaki"}, (20, 90)),
    # food
    _t("food", "protein bar", "Protein Bar", "Snack Foods › Bars › Protein Bars",
       "whey|nut|crisp|energy|snack",
       "gluten free|high protein|low sugar|keto friendly|non gmo|plant based",
       {"size": "12 count|24 count", "flavor": "chocolate|vanilla|peanut butter|caramel|cookie dough"}, (12, 45)),
    _t("food", "coffee", "Coffee", "Beverages › Coffee, Tea & Cocoa › Coffee › Whole Coffee Beans",
       "colombian|espresso|breakfast blend|french roast|sumatra",
       "medium roast|whole bean|organic|fair trade|single origin|dark roast",
       {"size": "12 ounce|2 pound|5 pound", "flavor": "hazelnut|vanilla|original|mocha"}, (9, 50)),
    _t("food", "herbal tea", "Herbal Tea", "Beverages › Coffee, Tea & Cocoa › Tea › Herbal",
       "sleepytime|detox|wellness|immune|calm",
       "caffeine free|organic|non gmo|gluten free|kosher",
       {"size": "20 count|40 count|100 count", "flavor": "chamomile|ginger|hibiscus|lemon|rooibos"}, (4, 25)),
    _t("food", "olive oil", "Olive Oil", "Pantry Staples › Cooking Oils › Olive",
       "greek|italian|spanish|california|tuscan",
       "extra virgin|cold pressed|organic|non gmo|kosher|first harvest",
       {"size": "16.9 fl oz|33.8 fl oz|101 fl oz"}, (8, 45)),
    _t("food", "mixed nuts", "Mixed Nuts", "Snack Foods › Nuts & Seeds › Mixed Nuts",
       "deluxe|trail|cashew|almond|pecan",
       "roasted|unsalted|high protein|gluten free|non gmo|resealable bag",
       {"size": "8 ounce|16 ounce|2 pound", "flavor": "sea salt|honey|smoked|spicy"}, (6, 35)),
    _t("food", "pasta", "Pasta", "Pantry Staples › Dried Beans, Grains & Rice › Pasta & Noodles › Pasta",
       "durum|semolina|artisan|bronze cut|chickpea",
       "gluten free|whole wheat|organic|non gmo|high fiber",
       {"size": "1 pound|2 pound|6 pack", "style": "spaghetti|penne|fusilli|rigatoni"}, (3, 25)),
    # furniture
    _t("furniture", "office chair", "Office Chair", "Home Office Furniture › Home Office Chairs › Desk Chairs",
       "executive|task|gaming|mesh back|ergonomic",
       "lumbar support|adjustable height|high back|swivel|padded armrests|breathable",
       {"color": "black|grey|white|blue|red"}, (60, 300)),
    _t("furniture", "coffee table", "Coffee Table", "Living Room Furniture › Tables › Coffee Tables",
       "lift top|round|farmhouse|nesting|glass top",
       "solid wood|storage shelf|easy assembly|living room|modern|rustic",
       {"color": _WOOD}, (50, 280)),
    _t("furniture", "bookshelf", "Bookshelf", "Living Room Furniture › Bookcases",
       "ladder|cube|corner|bookcase|etagere",
       "easy assembly|solid wood|storage space|living room|industrial|adjustable shelves",
       {"color": _WOOD}, (40, 250)),
    _t("furniture", "bed frame", "Bed Frame", "Bedroom Furniture › Beds, Frames & Bases › Bed Frames",
       "platform|upholstered|canopy|storage|headboard",
       "metal|easy assembly|under bed storage|noise free|heavy duty|no box spring needed",
       {"size": "twin|full|queen|king", "color": "black|white|grey|brown|navy"}, (90, 450)),
    _t("furniture", "tv stand", "TV Stand", "Living Room Furniture › Television Stands & Entertainment Centers",
       "console|media|entertainment|corner|floating",
       "storage shelf|cable management|living room|engineered wood|modern|tempered glass",
       {"color": _WOOD}, (60, 320)),
    _t("furniture", "bar stool", "Bar Stool", "Kitchen & Dining Room Furniture › Stools › Barstools",
       "counter|saddle|backless|industrial|farmhouse",
       "swivel|adjustable height|back support|faux leather|footrest|easy assembly",
       {"color": "black|white|grey|brown|navy|green"}, (35, 180)),
    # garden
    _t("garden", "garden hose", "Garden Hose", "Gardening & Lawn Care › Watering Equipment › Garden Hoses",
       "flexible|hybrid|rubber|coiled|hose reel",
       "kink free|heavy duty|expandable|lightweight|leak proof",
       {"size": "25 ft|50 ft|100 ft", "color": "green|blue|black|grey"}, (15, 80)),
    _t("garden", "solar lights", "Solar Lights", "Outdoor Décor › Outdoor Lighting › Pathway Lights",
       "pathway|spotlight|string|lantern|fence",
       "waterproof|auto on off|outdoor|bright|easy install|dusk to dawn",
       {"size": "4 pack|8 pack|12 pack", "color": "black|silver|bronze"}, (12, 60)),
    _t("garden", "planter pot", "Planter Pot", "Gardening & Lawn Care › Pots, Planters & Container Accessories › Planters",
       "ceramic|self watering|hanging|terracotta|cylinder",
       "drainage hole|indoor|modern|uv resistant|frost resistant",
       {"size": "small|medium|large", "color": "white|black|grey|green|terracotta"}, (10, 60)),
    _t("garden", "patio umbrella", "Patio Umbrella", "Patio Furniture & Accessories › Umbrellas & Shade › Patio Umbrellas",
       "market|cantilever|offset|tilt|beach",
       "uv protection|crank|wind resistant|waterproof|fade resistant",
       {"size": "7.5 ft|9 ft|10 ft", "color": "beige|navy|red|green|grey"}, (40, 220)),
    _t("garden", "bird feeder", "Bird Feeder", "Outdoor Décor › Bird & Wildlife Care › Bird Feeders",
       "hanging|window|tube|platform|hopper",
       "squirrel proof|easy clean|weather resistant|large capacity|easy fill",
       {"color": "green|black|red|copper|brown"}, (12, 60)),
    _t("garden", "pruning shears", "Pruning Shears", "Gardening & Lawn Care › Hand Tools › Pruning Shears",
       "bypass|anvil|ratchet|garden|floral",
       "sharp blade|ergonomic handle|stainless steel|rust resistant|lightweight",
       {"color": "red|green|orange|black|blue"}, (9, 45)),
)  # fmt: skip

CATEGORIES: tuple[str, ...] = tuple(CATEGORY_ROOTS)

BRANDS = (
    "Aurelia", "Bramble", "Cobalt", "Dunmore", "Everly", "Fjordic", "Glenhaven", "Halcyon", "Ironwood", "Juniper",
    "Kestrel", "Lumina", "Marlowe", "Northway", "Oakridge", "Pinecrest", "Quillon", "Redfern", "Solvane", "Thistle",
    "Umbra", "Vantage", "Westbrook", "Yarrow", "Zephyr", "Alderbay", "Brightmoor", "Calloway", "Driftwood", "Emberly",
)  # fmt: skip

_STOP = frozenset("a an and for the of with to in on by is".split())
# The nouns WebShop's spaCy tagger would find in these titles: brands, type nouns, model words.
NOUN_WORDS: frozenset[str] = frozenset(
    w
    for phrase in (
        *[b.lower() for b in BRANDS],
        *[t.noun.lower() for t in PRODUCT_TYPES],
        *[m for t in PRODUCT_TYPES for m in t.models],
    )
    for w in phrase.replace("-", " ").split()
    if w not in _STOP
)

BENEFITS = (
    "built for everyday use",
    "a thoughtful gift for friends and family",
    "easy to use at home or on the go",
    "backed by our satisfaction guarantee",
    "made to last",
    "great value for the price",
    "loved by thousands of customers",
    "carefully inspected before shipping",
)
SENTENCES = (
    "Our team tests every batch for quality.",
    "Designed with simple, honest materials.",
    "Makes a dependable choice for daily routines.",
    "Ships in recyclable packaging.",
    "Customers come back to it again and again.",
)
REVIEW_TITLES = ("Great value", "Works as described", "Not bad", "Love it", "Would buy again", "Just okay")
REVIEW_BODIES = (
    "Exactly what I was looking for.",
    "Arrived quickly and works well.",
    "Quality is fine for the price.",
    "My family uses it every day.",
    "Expected a bit more, but it does the job.",
)
INSTRUCTION_TEMPLATES = (
    "i need {query} that is {attrs_and}",
    "i am looking for {attrs_comma} {query}",
    "find me {query} that is {attrs_and}",
    "i want to buy {query} which is {attrs_and}",
    "i'm looking for {attrs_comma} {query}",
)
ASIN_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
